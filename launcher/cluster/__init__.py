"""Cluster integrations: MindCluster's reset.json and fault files, TaskD, multi-node coordination.

Owns: ``resetjson`` (reading reset.json) and ``resetfollow`` (following it during a run, deciding on
its changes), ``taskd`` / ``taskd_sidecar`` (TaskD preload and the manager sidecar), ``sync`` (the cross-node
restart protocol) over ``syncstore`` (its interface) with ``syncdir`` (shared files) or
``etcdstore`` (``etcdjoin``: joining; ``etcdview``: the leader's view) / ``etcdclient``
(``etcdsecurity``: TLS, user; ``etcdconf``: from the options) / ``etcdreset`` (etcd keys, and etcd
that lost its data),
``syncjoin`` (joining it), ``syncstart`` (an elastic job's first barrier), ``syncmaster`` (the
endpoint of a master that moved).

May import: ``launcher.supervision``, ``launcher.monitoring``, ``launcher.jobspec``,
``launcher.common``.
"""
