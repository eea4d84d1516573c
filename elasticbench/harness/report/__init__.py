"""Reports read records (plain dicts from results files), never live objects."""
