"""tier: pure logic, CPU

The job page's outcome part (app/web/outcome.py, templates/partials/outcome.html): a language model's
held-out perplexity (a classifier's top-1) after distillation and, where the finetune phase ran, after it,
each beside its teacher's; a search under a latency budget, its candidates' measured forward and what the
choice reached.
"""

from __future__ import annotations

import re

from app.web.outcome import OutcomeView, costs_of, layer_choices, quality_of
from app.web.templating import templates
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
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


def test_a_latency_budget_shows_each_candidates_forward_and_what_the_choice_reached() -> None:
    candidates = [
        CandidateResult(block=0, name=name, loss=loss, params=params, kv_cache_bytes=64, latency_s=latency)
        for name, loss, params, latency in (("keep", 0.0, 1000, 0.0040), ("ffn_1/2", 0.25, 600, 0.0025))
    ]
    architecture = Architecture(
        blocks=[
            ArchitectureBlock(block=0, layers=["ffn_1/2"], loss=0.25, params=600, kv_cache_bytes=64, latency_s=0.0025)
        ],
        candidates=candidates,
        chosen_by="lowest summed held-out loss within the budget (mixed-integer program)",
        teacher_params=1000,
        teacher_kv_cache_bytes=64,
        teacher_latency_s=0.004,
        budget={"latency": 0.7},
        reached={"params": 0.6, "kv_cache": 1.0, "latency": 0.625},
    )
    view = OutcomeView(names=["keep", "ffn_1/2"], layers=layer_choices(architecture)[1], costs=costs_of(architecture))
    view.budgeted, view.chosen_by = True, architecture.chosen_by
    html = re.sub(r"\s+", " ", templates.get_template("partials/outcome.html").render(outcome=view))
    text = re.sub(r"<[^>]+>", "", html)
    assert "Budget: latency at most 70.0% of the teacher's layers" in text
    assert "latency 62.5% (2.50 of 4.00 ms forward, as profiled)" in text
    assert "params 60.0% (600 of 1,000 parameters)" in text
    assert '<td class="chosen">0.25 <small>600 · 64 B · 2.500 ms</small>' in html


def test_a_classifiers_top1_after_distillation_and_after_finetuning() -> None:
    summary = Summary(name="vit", student_top1=0.579, teacher_top1=0.858)
    summary.finetune = FinetuneReport(
        strategy="zb", top1_before=0.579, top1_after=0.808, teacher_top1=0.858, student=ModelSize(params=1, flops=1.0)
    )
    html = rendered(summary)
    distilled, finetuned = html.index('id="outcome-top1"'), html.index('id="outcome-top1-finetuned"')
    assert distilled < finetuned and "distilled <strong>57.9%</strong>" in html[:finetuned]
    assert "fine-tuned <strong>80.8%</strong>" in html[finetuned:] and "teacher 85.8%" in html[finetuned:]
