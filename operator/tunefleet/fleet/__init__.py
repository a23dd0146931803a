"""One library for a fleet of clusters (docs/fleet.md): a profile adopts a complete, verified
artifact that another profile or cluster sharing its store tuned for the same identity, and of
those that need an identity at the same moment one tunes (it holds the claim) while the others
wait and adopt. claims.py decides and takes claims; adopt.py reads, verifies and publishes
entries; the objects themselves are contracts/fleet.py's.
"""
