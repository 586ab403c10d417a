"""The held-out skill (no agent trains on it): capitals of countries, a knowledge skill of the pretrained base.

Merging agents that never saw it should not lose it; what a merge keeps here is its forgetting. The answer is
right when it names the country's capital as whole words and no other capital of the list. Its splits share
countries (only the wording differs): no agent trains on it, so nothing leaks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentmerge_zoo.real.tasks import Example, Score, mentions, strict_partial

_PAIRS = """France:Paris Germany:Berlin Italy:Rome Spain:Madrid Portugal:Lisbon Greece:Athens Egypt:Cairo Japan:Tokyo
China:Beijing Russia:Moscow Canada:Ottawa Mexico:Mexico_City Peru:Lima Chile:Santiago Argentina:Buenos_Aires
Norway:Oslo Sweden:Stockholm Finland:Helsinki Denmark:Copenhagen Poland:Warsaw Austria:Vienna Hungary:Budapest
Ireland:Dublin Belgium:Brussels Netherlands:Amsterdam Switzerland:Bern Turkey:Ankara Iran:Tehran Iraq:Baghdad
India:New_Delhi Pakistan:Islamabad Thailand:Bangkok Vietnam:Hanoi Indonesia:Jakarta Philippines:Manila
Kenya:Nairobi Nigeria:Abuja Ghana:Accra Ethiopia:Addis_Ababa Morocco:Rabat Cuba:Havana Colombia:Bogota
Venezuela:Caracas Ecuador:Quito Australia:Canberra Ukraine:Kyiv Romania:Bucharest Bulgaria:Sofia Serbia:Belgrade
Croatia:Zagreb Czechia:Prague Iceland:Reykjavik Israel:Jerusalem Jordan:Amman Lebanon:Beirut Syria:Damascus
Afghanistan:Kabul Nepal:Kathmandu Mongolia:Ulaanbaatar Uruguay:Montevideo Paraguay:Asuncion Bolivia:La_Paz
Senegal:Dakar Sudan:Khartoum Algeria:Algiers Tunisia:Tunis Libya:Tripoli Qatar:Doha"""
CAPITALS = dict(pair.replace("_", " ").split(":") for pair in _PAIRS.split())
QUESTIONS = (
    "What is the capital of {country}?",
    "Which city is the capital of {country}?",
    "Name the capital city of {country}.",
    "What city is {country}'s capital?",
    "Tell me the capital of {country}.",
    "Which city is {country}'s seat of government?",
    "{country} has which city as its capital?",
    "I forgot the capital of {country}. What is it?",
)
SUFFIXES = ("", " Answer in one word.", " Reply with the city only.", " Be brief.")


@dataclass(frozen=True)
class CapitalsSkill:
    name: str = "capitals"
    max_new_tokens: int = 16

    def sample(self, rng: random.Random) -> Example:
        country = rng.choice(sorted(CAPITALS))
        user = rng.choice(QUESTIONS).format(country=country) + rng.choice(SUFFIXES)
        return Example(self.name, user, {"answer": CAPITALS[country]})

    def score(self, example: Example, completion: str) -> Score:
        answer = example.data["answer"]
        others = (c for c in set(CAPITALS.values()) if c != answer and not mentions(answer, c))
        right = mentions(completion, answer) and not any(mentions(completion, c) for c in others)
        return strict_partial(right, float(right))
