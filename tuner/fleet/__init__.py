"""A fleet of daemons sharing what they learn on one PostgreSQL database."""
