"""The certified fast reference: double-double arithmetic with proven bounds, for rows
(`rows`, `rows_grad`) and attention (`attention`, `attention_grad`, `normalize`)."""
