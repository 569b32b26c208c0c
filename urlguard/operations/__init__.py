"""Running it as a service: health probes, `/metrics` (with what is read when scraped),
the JSON check API and its keys, and the log format."""
