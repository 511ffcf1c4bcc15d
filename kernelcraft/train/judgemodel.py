"""An optional judge model: an OpenAI-compatible LLM that reviews suspicious candidates and may veto them.

Asked only about reproduced jumps of `correct` candidates; it can take a reward away, never grant one. A
reply that is not `{"hack": bool, "reason": str}`, or an endpoint error, is no veto.

Rationale: docs/design/train.md#judgemodel
"""
from __future__ import annotations

import json
import re

from kernelcraft.train.models import TrainError
from kernelcraft.train.prompting import template

_JSON = re.compile(r"\{.*\}", re.DOTALL)


class JudgeModel:
    def __init__(self, settings, *, client=None):
        self.s = settings
        if client is None:
            try:
                import openai
            except ImportError:
                raise TrainError("grpo.judge_model needs the openai package: pip install 'kernelcraft[llm]'") from None
            import os

            key = os.environ.get(settings.api_key_env) or ("EMPTY" if settings.base_url else None)
            if not key:
                raise TrainError(f"grpo.judge_model: set {settings.api_key_env} (or give a base_url of a local server)")
            client = openai.OpenAI(base_url=settings.base_url, api_key=key, max_retries=2)
        self.client = client

    def messages(self, *, reference: str, candidate: str, speedup: float, flag: str, similar: list[dict]) -> list[dict]:
        shown = "\n\n".join(f"## Case {c['id']}: {c['label']} ({c['reason']}; similarity {c['similarity']})\n\n"
                            f"```python\n{c['code'].strip()}\n```" for c in similar) or "None stored yet."
        user = template("judge_user.md").substitute(reference=reference.strip(), candidate=candidate.strip(),
                                                    speedup=f"{speedup:.2f}x", flag=flag, similar=shown)
        return [{"role": "system", "content": template("judge_system.md").substitute().strip()},
                {"role": "user", "content": user.strip()}]

    def review(self, **case) -> dict:
        """{"veto": bool, "reason": str, "raw": reply} or, when the reviewer failed, {"veto": False, "error": ...}."""
        try:
            resp = self.client.chat.completions.create(model=self.s.model, messages=self.messages(**case),
                                                       temperature=self.s.temperature, max_tokens=self.s.max_tokens)
            text = resp.choices[0].message.content or ""
        except Exception as e:  # noqa: BLE001 — any endpoint failure is "no veto", recorded
            return {"veto": False, "error": f"{type(e).__name__}: {e}"}
        m = _JSON.search(text)
        try:
            obj = json.loads(m.group(0)) if m else None
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("hack"), bool):
            return {"veto": False, "error": "the reply is not {\"hack\": bool, \"reason\": str}", "raw": text[:2000]}
        return {"veto": obj["hack"], "reason": str(obj.get("reason", ""))[:500], "raw": text[:2000]}
