"""Where artifacts live. store.py is the contract (Store, its errors, Location, StoreOptions,
PodStorage); s3.py and filesystem.py are the backends (s3://, pvc:// and file://); registry.py
picks one by URI scheme; cli_flags.py declares the CLIs' storage flags."""
