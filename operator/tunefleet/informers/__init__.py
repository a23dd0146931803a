"""What the operator follows and keeps: the kinds it lists and watches (watch.py, on
runtime/reflector.py), the small views it keeps of them (views.py) and the cache that holds
those views by key and owner (cache.py)."""
