"""cooperation.md's data: the sources' exact words. A data module: it imports nothing, so the claim registry
and any page can read it without importing a page."""

# the sources' words, quoted exactly (../shared/seeds/)
TITLE = "Do Attention Heads Compete or Cooperate during Counting?"
QUESTION = (
    "we ask whether the attention heads behave as a pseudo-ensemble, all solving the same subtask, or they "
    "perform different subtasks, meaning that they can only solve the original task in conjunction"
)
FINDING = "on the semantics of the counting task, attention heads behave as a pseudo-ensemble"
TABLE1 = "Heads trained jointly perform slightly worse than heads trained in isolation (Table 1)"
INTERFERE = "for any given pair of inputs they will constructively interfere on the correct answer"
ONLY_CORRECT = "In contexts where both heads write to multiple outputs, they will only constructively interfere on the correct token."
SUPERPOSE = "We think this shows an interesting example of heads performing computation in superposition."
DISTRIBUTE = (
    "The heads furthermore implement these nested conditionals in such a way that they distribute important "
    "source tokens between them, and constructively interfere to produce the correct answer."
)
LEAST_FAVOURITE = "For contexts that contain their “least favourite” token repeated, the heads can confidently guess the correct answer by a process of eliminating options from its own attention hierarchy."
ONE_HEAD = "We were also surprised that this problem can be solved with one head, as long as d_head >= 4."
# every quote, with the source document (../shared/seeds/) it is taken from verbatim
QUOTES = {
    "title": (TITLE, "count01-paper-abstract.md"), "question": (QUESTION, "count01-paper-abstract.md"),
    "finding": (FINDING, "count01-paper-abstract.md"), "table1": (TABLE1, "count01-paper-summary.md"),
    "interfere": (INTERFERE, "ov-coherent-skip-pair-post.md"), "only_correct": (ONLY_CORRECT, "ov-coherent-skip-pair-post.md"),
    "superpose": (SUPERPOSE, "ov-coherent-skip-pair-post.md"), "distribute": (DISTRIBUTE, "ov-coherent-skip-pair-post.md"),
    "one_head": (ONE_HEAD, "ov-coherent-skip-pair-post.md"),
    "least_favourite": (LEAST_FAVOURITE, "ov-coherent-skip-pair-post.md"),
}  # fmt: skip
