"""The pod admission webhook: serving TLS, registration, and the injection it applies."""
