"""The designed tasks: generators of synthetic data, their metrics and tiny models, to test a
method where its effect must show. Not imported by the plugin."""
