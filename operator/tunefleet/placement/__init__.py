"""Where tuning runs: the node maps (nodemap_keeper.py) that say, per GPU label key, which nodes
carry which GPU model, kept as ConfigMaps by the leader and read by admission's placement."""
