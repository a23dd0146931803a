"""Pure functions from a profile (and settings) to Kubernetes manifests. No API calls here."""
