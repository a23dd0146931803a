"""The informers' machinery, on runtime/reflector.py's lists and watches: a cache of small views
of watched objects, roots by key and children by owner (view_cache.py), and the pieces views are
made of (view_parts.py). It imports nothing of tunefleet's domain (tests/unit/test_layering.py):
what tunefleet watches and keeps is watched/."""
