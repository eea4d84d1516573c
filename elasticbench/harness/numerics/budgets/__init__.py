"""Error budgets in ulps: for rows (`rows`) and attention (`attention`)."""
