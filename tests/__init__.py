"""The test suite (a package, so that test modules can import ``tests.fixtures``)."""
