"""SkipPair's data for its pages: the post's exact words (QUOTES). A data module: it imports nothing, so any page
can read it without importing another page."""

# The post's words, quoted exactly from ../shared/seeds/ov-coherent-skip-pair-post.md, one per row of the
# claims table (in CLAIM_SECTIONS' order). Each verdict tests no more than the quoted sentence says.
QUOTES = {
    "perfect": "Here, we focus on a 2-head model which solves the task with perfect accuracy",
    "dhead1": "we were surprised by how limited we could make this model while achieving perfect accuracy on a "
    "signal-only test set. We were particularly surprised by the model’s capability for d_head = 1",
    "strict": "Both heads learn a strict “preference ordering” over signal tokens",
    "reversed": "with the ordering generally reversed between the two heads",
    "split": "the model sometimes learned a “split attention” scheme during training, in which the heads would "
    "attend to the same tokens to varying degree. Notably, we only saw split attention for d_head < 3",
    "conditional": "as they run through their preferences, the heads successively write strongly to the logits of "
    "one fewer completion",
    "only_correct": "In contexts where both heads write to multiple outputs, they will only constructively "
    "interfere on the correct token.",
    "one_head": "We were also surprised that this problem can be solved with one head, as long as d_head >= 4.",
    "caption": "for any given pair of inputs they will constructively interfere on the correct answer",
    "fully_attended": "This guarantees that, for any given context, both signal tokens are fully attended to.",
    "least_favourite": "For contexts that contain their “least favourite” token repeated, the heads can confidently "
    "guess the correct answer by a process of eliminating options from its own attention hierarchy.",
    "orthogonal": "for d_head >=3, the signal tokens can be stored orthogonally in that dimension",
    "tradeoff": "Possibly there is a trade-off here between degrees of freedom in d_head and n_heads, though this is "
    "not super crisp.",
}
