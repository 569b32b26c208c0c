"""Running it as a service: health probes, the JSON check API and its keys, and the log format."""
