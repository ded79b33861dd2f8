"""The console's views: pages (reads) and actions (writes), thin over selectors and actions."""
