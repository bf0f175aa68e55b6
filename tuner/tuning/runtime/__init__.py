"""The engine on live traffic: routing, learning, the daemon service and what it persists."""
