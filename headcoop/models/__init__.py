"""The models headcoop runs: the TransformerLens version shim (`tl`: its names, with placeholders where 4.x removed
`HookedTransformer`), the fused forward pass of K stacked models the fast trainer uses (`fused`), and
TransformerLens's TransformerBridge as headcoop reads it (`bridge`: which kind of model, its own routing hooks left
out of a user's, Hugging Face folders).

May import `headcoop.checks` and `headcoop.paths` only: tasks, storage and every floor above build on it.
"""
