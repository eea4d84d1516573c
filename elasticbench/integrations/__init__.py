"""Integrations of the family with other libraries' model definitions.

Each integration lives in its own module and imports its library only there, so that
`import elasticbench`, elasticbench.functional and elasticbench.nn load without it:

    from elasticbench.integrations import transformers as eb_hf   # needs transformers
    eb_hf.use_family(model, "elastic")

docs/transformers.md is the user's page of the transformers integration.
"""
