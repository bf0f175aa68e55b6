"""Which engine serves: the engines measured side by side on this machine and model,
the choice kept in the state dir, and the daemon's background switch to the faster."""
