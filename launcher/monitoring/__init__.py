"""What a run tells about itself: ``events`` (events.jsonl) and ``errorfile`` (why a rank failed).

Home of status and metrics to come.

May import: ``launcher.common``.
"""
