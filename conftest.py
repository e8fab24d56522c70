# The harness's pytest plugin: markers, GPU skipping, scenario items. Test helpers are in tests/
pytest_plugins = ["harness.orchestrate.pytest_plugin"]
