"""The read API: the cached cluster overview and the Lens tables over HTTP, as the original served them."""
