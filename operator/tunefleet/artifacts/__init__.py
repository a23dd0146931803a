"""Artifacts: publish tuned results to object storage, fetch them into serving pods, and
bootstrap the tuner into the user's image.

Kept free of heavy imports (boto3 is loaded only for s3:// URIs) so that the directory store and
the CLIs' checks also run where only the standard library is available.
"""
