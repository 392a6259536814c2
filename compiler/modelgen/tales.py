"""A generator of short, simple fairy-tale stories: original text we may ship.

The demo model has a few minutes of CPU to learn English. Plain, regular
stories (in the spirit of TinyStories) are learnable at that budget where
Shakespeare is not, and writing the generator ourselves keeps the corpus's
licence simple. ``corpus/tales.txt`` is this module's output for seed 0:

    python -m graphc.compiler.modelgen.tales > compiler/modelgen/corpus/tales.txt

Stories are separated by a blank line; each story is one paragraph.
"""

from __future__ import annotations

import random
import sys

# (kind, pronoun set) — pronouns: subject, object, possessive
HE = ("he", "him", "his")
SHE = ("she", "her", "her")

NAMES = {
    HE: ["Tom", "Sam", "Ben", "Leo", "Max", "Finn", "Jack", "Oliver", "Hugo", "Peter",
         "Arthur", "Toby", "Oscar", "Milo", "Henry", "Felix", "Jasper", "Rufus"],
    SHE: ["Lily", "Anna", "Mia", "Rosa", "Ella", "Lucy", "Clara", "Daisy", "Ivy", "Nora",
          "Ruby", "Grace", "Alice", "Molly", "Hazel", "Poppy", "Greta", "Willow"],
}

CHARACTERS = [
    "little fox", "young rabbit", "tiny mouse", "brave girl", "curious boy", "old farmer",
    "kind baker", "small bear", "clever cat", "shy owl", "happy duck", "young prince",
    "young princess", "busy squirrel", "gentle giant", "little dragon", "poor fisherman",
    "wise old woman", "friendly dog", "lonely frog", "proud rooster", "tired donkey",
    "little girl", "little boy", "hungry wolf", "young shepherd", "small turtle",
]

PLACES = [
    ("small village", "near the edge of a great forest"),
    ("little house", "at the top of a green hill"),
    ("quiet town", "by the side of a wide river"),
    ("cosy cottage", "in the middle of a dark wood"),
    ("busy farm", "not far from the sea"),
    ("tall castle", "high up in the mountains"),
    ("warm burrow", "under an old oak tree"),
    ("tiny hut", "beside a deep blue lake"),
    ("sunny valley", "between two snowy mountains"),
    ("windmill", "at the end of a long road"),
]

ADJ = ["kind", "brave", "curious", "gentle", "clever", "cheerful", "shy", "stubborn",
       "careful", "cheeky", "patient", "playful"]

GOALS = [
    ("find the golden key that had been lost for many years", "the golden key"),
    ("see the sea for the very first time", "the sea"),
    ("bake the biggest cake in the whole village", "the cake"),
    ("climb to the top of the tallest hill", "the top of the hill"),
    ("find a new friend to play with", "a friend"),
    ("learn how to sing like the birds", "the song"),
    ("catch a falling star", "the star"),
    ("grow the most beautiful flower in the garden", "the flower"),
    ("find the way back home before dark", "home"),
    ("bring some water to the thirsty old tree", "the water"),
    ("build a little boat that could really float", "the boat"),
    ("find the end of the rainbow", "the rainbow"),
    ("carry a letter to the king", "the letter"),
    ("find a warm place to sleep for the winter", "a warm bed"),
    ("learn to read the big old book in the library", "the book"),
]

PROBLEMS = [
    "the path was long and full of stones",
    "a cold wind began to blow",
    "a wide river was in the way",
    "the night was coming fast",
    "a big storm came over the hills",
    "the forest was dark and very quiet",
    "the bridge over the stream was broken",
    "nobody in the village believed it could be done",
    "a thick fog covered everything",
    "the gate was locked and the key was too high to reach",
]

HELPERS = [
    ("an old owl", "the owl"), ("a friendly goat", "the goat"), ("a wise tortoise", "the tortoise"),
    ("a little bird", "the bird"), ("a kind old man", "the old man"),
    ("a busy beaver", "the beaver"), ("a talking tree", "the tree"),
    ("a small mouse", "the mouse"), ("a brown horse", "the horse"),
    ("a young girl with a red hat", "the girl"), ("a tall heron", "the heron"),
    ("a sleepy badger", "the badger"),
]

HELP_ACTIONS = [
    "showed {o} a hidden path through the trees",
    "carried {o} across the water on a strong back",
    "gave {o} a warm coat and a piece of bread",
    "told {o} a secret about the old stones",
    "lit a small lantern so that {s} could see",
    "pulled a long rope and lifted {o} up high",
    "sang a song that made the wind grow calm",
    "shared a map that had been drawn long ago",
]

FEELINGS = ["sad", "worried", "tired", "afraid", "lonely", "lost"]

ENDINGS = [
    "From that day on, {name} and {helper} were the best of friends.",
    "And they all lived happily ever after.",
    "That night, {name} slept well and dreamed of new adventures.",
    "{Name} learned that {moral}.",
    "When {s} came home, everyone cheered, and {poss} mother gave {o} a big hug.",
    "{Name} smiled, because {s} knew that {moral}.",
    "And whenever {s} looked at {thing}, {s} remembered that {moral}.",
]

MORALS = [
    "a good friend makes every road shorter",
    "it is always worth asking for help",
    "small steps can take you very far",
    "being kind is better than being clever",
    "you should never give up on a dream",
    "sharing makes everyone happier",
    "courage means going on even when you are afraid",
    "patience is a kind of magic",
]

DIALOGUE_ASK = [
    '"Why are you so {feeling}?" asked {helper}.',
    '"What is the matter, little one?" asked {helper}.',
    '"Where are you going all alone?" asked {helper}.',
    '"Can I help you?" asked {helper} kindly.',
]

DIALOGUE_ANSWER = [
    '"I want to {goal}," said {name}, "but {problem}."',
    '"I am trying to {goal}," said {name} with a sigh, "but {problem}."',
    '"I must {goal}," said {name}, "but I do not know how."',
]

MIDDLES = [
    "{Name} walked and walked until {poss} feet were sore.",
    "{S} looked left and right, but {s} could not see the way.",
    "{S} sat down on a rock and thought very hard.",
    "{S} tried once, and then {s} tried again, but it was too hard.",
    "{S} followed a little stream that sang between the stones.",
    "The sun went down, and the stars came out one by one.",
]

WEATHER = [
    "It was a bright morning in spring.", "It was a cold winter day.",
    "It was a warm summer evening.", "It was a grey and rainy autumn day.",
    "The sun was shining and the birds were singing.",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def story(rng: random.Random) -> str:
    kind = rng.choice(CHARACTERS)
    # Gendered nouns fix the pronoun; animals and the rest get either.
    if kind.endswith(("princess", "girl", "woman")):
        pron = SHE
    elif kind.endswith(("prince", "boy", "farmer", "fisherman", "shepherd", "giant")):
        pron = HE
    else:
        pron = rng.choice([HE, SHE])
    s, o, poss = pron
    name = rng.choice(NAMES[pron])
    place, where = rng.choice(PLACES)
    goal, thing = rng.choice(GOALS)
    problem = rng.choice(PROBLEMS)
    helper_a, helper = rng.choice(HELPERS)
    moral = rng.choice(MORALS)
    adj = rng.choice(ADJ)
    art = "an" if adj[0] in "aeiou" else "a"

    fmt = dict(
        name=name, Name=name, s=s, S=_cap(s), o=o, poss=poss, goal=goal, thing=thing,
        problem=problem, helper=helper, moral=moral, feeling=rng.choice(FEELINGS),
    )

    opening = rng.choice([
        f"Once upon a time, there was {art} {adj} {kind} named {name}.",
        f"Once upon a time, in a {place} {where}, there lived {art} {adj} {kind} called {name}.",
        f"Long ago, in a {place} {where}, lived {art} {adj} {kind} named {name}.",
        f"Once upon a time, {art} {adj} {kind} named {name} lived in a {place} {where}.",
        f"There was once {art} {adj} {kind} called {name}, who lived in a {place} {where}.",
    ])
    parts = [opening]
    if rng.random() < 0.5:
        parts.append(rng.choice(WEATHER))
    parts.append(rng.choice([
        f"More than anything, {name} wanted to {goal}.",
        f"One day, {name} decided to {goal}.",
        f"{name} had a dream: {s} wanted to {goal}.",
    ]))
    parts.append(rng.choice([
        f"But {problem}.",
        f"So {s} set off early in the morning. But soon {problem}.",
        f"{_cap(s)} packed a small bag and set off. But {problem}.",
    ]))
    if rng.random() < 0.6:
        parts.append(rng.choice(MIDDLES).format(**fmt))
    parts.append(f"Then {name} met {helper_a}.")
    if rng.random() < 0.8:
        parts.append(rng.choice(DIALOGUE_ASK).format(**fmt))
        parts.append(rng.choice(DIALOGUE_ANSWER).format(**fmt))
        parts.append(rng.choice([
            f'"Do not worry," said {helper}. "I will help you."',
            f'"I know what to do," said {helper} with a smile.',
            f'"Come with me," said {helper}.',
        ]))
    parts.append(_cap(helper) + " " + rng.choice(HELP_ACTIONS).format(**fmt) + ".")
    parts.append(rng.choice([
        f"At last, {name} was able to {goal}.",
        f"After a long day, {name} finally reached {thing}.",
        f"And so, step by step, {name} managed to {goal}.",
    ]))
    parts.append(rng.choice([
        f'"Thank you," said {name}. "I could not have done it without you."',
        f"{name} was so happy that {s} danced and laughed.",
        f"{_cap(poss)} heart was full of joy.",
    ]))
    parts.append(rng.choice(ENDINGS).format(**fmt))
    return " ".join(parts)


def tales(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [story(rng) for _ in range(n)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 2500
    sys.stdout.write("\n\n".join(tales(n)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
