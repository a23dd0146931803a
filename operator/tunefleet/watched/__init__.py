"""What tunefleet watches and keeps, on the informers' machinery (informers/): the kinds it
lists and watches (kinds.py), the small views it keeps of them (views.py) and the cache of
profiles, their tuning Jobs and pods (cache.py)."""
