"""The TuningProfile reconciler: its engine (controller.py: work queue, workers, resync), the
reconcile itself (reconcile.py: gather, decide, apply), the pure decisions (decide.py,
observe.py, diagnose.py, promotion.py, status.py), what it remembers between passes
(memory.py), Kueue's word on a waiting Job (workloads.py) and the Events of its transitions
(announce.py)."""
