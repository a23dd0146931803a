"""Fakes and helpers shared by the tests (a test module never imports another); the builders of
test objects live in testbed/builders/. The table in tests/README.md says what each module here
gives and which tier uses it."""
