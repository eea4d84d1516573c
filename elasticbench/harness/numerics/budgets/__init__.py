"""Error budgets in ulps: for rows (`row_budgets`) and attention (`attention_budgets`,
`attention_own`)."""
