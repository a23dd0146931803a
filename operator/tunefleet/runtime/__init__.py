"""The controller machinery, apart from the domain: what controller-runtime and client-go are
to a Go operator. client.py (the shared connection, the write fence, the error words),
reflector.py (list then watch, feeding registered handlers), workqueue.py (deduplicating,
delayed, backed-off keys), leader.py (Lease election and the fence it sets), heap.py (giving
memory back after bursts).

Nothing here imports the rest of tunefleet (tests/unit/test_layering.py): the domain builds on
it and can change beneath it.
"""
