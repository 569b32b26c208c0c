"""The service's admin branding (a site that installs the app keeps its own)."""

from django.contrib import admin

# The product's name where Django would say "Django administration".
admin.site.site_header = "URL guard administration"
admin.site.site_title = "URL guard admin"
admin.site.index_title = "Spam rules, short links and the filter"
# The navigation sidebar repeats the home page's app list and takes 300 px of every
# change list: without it the lists' columns fit a 1280 px screen.
admin.site.enable_nav_sidebar = False
