"""Count01's data for its pages: the source's exact words (QUOTES) and its headline number. A data module: it
imports nothing, so any page can read it without importing another page."""

PAPER_R = 0.72

# The source's words, quoted exactly from ../shared/seeds/count01-paper-summary.md (a summary of the paper:
# text inside its quotation marks is the paper's own; the rest is the summary's). Each verdict below tests
# no more than the quoted sentence says.
QUOTES = {
    "half": "About half of the heads are highly successful at linearly separating inputs (high s-acc)",
    "w01": "Successful heads have w01 ≈ 1, i.e., the head attends roughly equally to the '0' and '1' tokens",
    "w02": "Successful heads have w02 > 10",
    "band": "Manually set attention to '2' tokens to zero and sweep w01 from 0.001 to 1000. Confirm that s-acc "
    "remains high for 0.1 < w01 < 10, as shown in Figure 8.",
    "r": "Pearson correlation coefficient of the two values is 0.72",
    "joint": "Heads trained jointly perform slightly worse than heads trained in isolation (Table 1)",
    "bias": "heads are typically biased toward one out of '4' or '5'",
    "tip": "the ordering of the logits is about fixed, but the balance between the logits tips toward '[EOS]' when "
    "we move from '=' to '4' or '5'",
    "minimal": "Minimal solution (d=1, d'=1, 1 head) exists",
    "reach": "but is difficult to reach via gradient descent from random initialization",
    "noise": "If noise token '2' receives significant attention, it introduces variance and degrades separability",
    "aggregate": "their outputs need to be aggregated in a non-uniform manner in order to create an encoding that "
    "conforms to the syntax",
    "exploit": "the model doesn't fully exploit these successful heads individually",
    "collapse": "If attention strongly favors '0' or '1', head outputs collapse to a point",
    "reliably": "Larger models (d=32, 16 heads) train reliably",
    "two_tasks": "the model is working as a proper ensemble, solving two separate tasks",
}
