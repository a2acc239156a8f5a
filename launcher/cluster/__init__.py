"""Cluster integrations: MindCluster's reset.json and fault files, TaskD, multi-node coordination.

Owns: ``resetjson`` (reset.json reader and follower), ``taskd`` / ``taskd_sidecar`` (TaskD preload
and sidecar) and ``sync`` (the cross-node restart coordinator).

May import: ``launcher.supervision``, ``launcher.monitoring``, ``launcher.jobspec``,
``launcher.common``.
"""
