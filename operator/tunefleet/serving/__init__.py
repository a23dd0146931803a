"""How model pods are served their artifacts: the operator's delivery of each artifact as a
ConfigMap or a verified volume image (delivery.py), which artifact ConfigMaps exist now
(delivered.py, read by admission) and the pods that ran untuned for a cause of ours
(served.py, the Degraded condition)."""
