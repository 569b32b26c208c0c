"""The curated list served to browsers and other clients as a Safe Browsing v4 Update
API: each threat list is the SHA-256 prefixes of the rules' expressions at one
change-log position, and a partial update is the difference between two positions."""
