"""Optional apps that plug urlguard into other Django apps: each is added to
INSTALLED_APPS on its own, beside the app it serves."""
