"""Case matrices as TOML data files; installed as package data of `elasticbench.cases`."""
