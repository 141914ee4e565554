"""tier: pure logic, CPU

The job page's outcome part (app/web/outcome.py, templates/partials/outcome.html): a language model's
held-out perplexity after distillation and, where the finetune phase ran, after it, each beside its teacher's.
"""

from __future__ import annotations

from app.web.outcome import OutcomeView, quality_of
from app.web.templating import templates
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary


def language_summary(finetuned: bool) -> Summary:
    summary = Summary(name="llama", student_perplexity=31.25, teacher_perplexity=20.5)
    if finetuned:
        size = ModelSize(params=10, flops=10.0)
        summary.finetune = FinetuneReport(
            strategy="zb",
            top1_before=None,
            top1_after=None,
            perplexity_before=31.25,
            perplexity_after=24.75,
            teacher_perplexity=20.5,
            student=size,
        )
    return summary


def rendered(summary: Summary) -> str:
    return templates.get_template("partials/outcome.html").render(outcome=OutcomeView(quality=quality_of(summary)))


def test_the_distilled_perplexity_alone_before_any_finetune() -> None:
    html = rendered(language_summary(finetuned=False))
    assert "distilled <strong>31.25</strong>" in html and "teacher 20.50" in html
    assert "outcome-perplexity-finetuned" not in html and "before any end-to-end training" in html


def test_the_finetuned_perplexity_follows_the_distilled_one() -> None:
    html = rendered(language_summary(finetuned=True))
    distilled, finetuned = html.index('id="outcome-perplexity"'), html.index('id="outcome-perplexity-finetuned"')
    assert distilled < finetuned
    assert "fine-tuned <strong>24.75</strong>" in html[finetuned:] and "after end-to-end training" in html[finetuned:]
