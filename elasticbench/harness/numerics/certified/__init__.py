"""The certified fast reference: double-double arithmetic with proven bounds, for rows
(`rows_forward`, `rows_grad`) and attention (`attention_forward`, `attention_grad`, `normalize`)."""
