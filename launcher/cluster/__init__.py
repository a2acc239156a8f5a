"""Cluster integrations: MindCluster's reset.json and fault files, TaskD, multi-node coordination.

Owns: ``resetjson`` (reading reset.json) and ``resetfollow`` (following it during a run, deciding on
its changes), ``taskd`` / ``taskd_sidecar`` (TaskD preload and the manager sidecar), ``sync`` /
``syncdir`` / ``etcdstore`` / ``etcdclient`` / ``syncjoin`` (the cross-node restart protocol, its
stores: shared files or etcd, joining it).

May import: ``launcher.supervision``, ``launcher.monitoring``, ``launcher.jobspec``,
``launcher.common``.
"""
