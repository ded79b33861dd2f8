"""Websocket routes of the live console."""

websocket_urlpatterns: list = []
