"""Helpers shared by the tests: the local cluster and S3 server (cluster.py), polling."""
