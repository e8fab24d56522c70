# The harness's pytest plugin: markers, GPU skipping, and oracle-run fixtures.
pytest_plugins = ["harness.pytest_plugin"]
