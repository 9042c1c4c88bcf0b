pytest_plugins = ["tests.service_fixtures"]
