"""User requests for the draft's training data, written without the target.

Topics crossed with task templates, arithmetic word problems with fresh numbers, code and
translation requests, and everyday chat. Every prompt is a list of chat messages, so
multi-turn requests fit the same record. Nothing here may reach the held-out evaluation:
`build_prompts` drops any prompt that names a held-out topic or repeats a held-out request.
"""

from __future__ import annotations

import json
import random
import re
from importlib import resources

TOPICS = [
    "volcanoes", "honeybees", "the Great Wall of China", "black holes", "photosynthesis", "coral reefs",
    "the printing press", "rainbows", "the human heart", "earthquakes", "the Roman aqueducts", "penguins",
    "solar panels", "tea ceremonies", "the Industrial Revolution", "DNA", "tsunamis", "the Eiffel Tower",
    "elephants", "recycling", "the Olympic Games", "bread baking", "the immune system", "comets",
    "the Renaissance", "deserts", "electric cars", "the water cycle", "sleep", "the Internet",
    "chess", "the Sahara", "coffee", "dinosaurs", "the Moon", "hurricanes", "jazz music", "the Nile",
    "bicycles", "the stock market", "volunteering", "mountains", "fungi", "the ancient Egyptians",
    "the violin", "airplanes", "climate change", "the periodic table", "whales", "the Vikings",
    "gardening", "chocolate", "the French Revolution", "spiders", "nuclear power", "bamboo",
    "the Pacific Ocean", "yoga", "robots", "Mars", "the Aztecs", "tornadoes", "wolves", "libraries",
    "the telephone", "fermentation", "the Arctic", "sharks", "the Milky Way", "democracy", "typewriters",
    "sourdough", "the Mayan calendar", "caves", "owls", "the steam engine", "vaccines", "kites",
    "the Great Barrier Reef", "trains", "meteors", "rice farming", "the piano", "butterflies",
    "the Cold War", "3D printing", "tides", "pyramids", "snowflakes", "the ozone layer", "camels",
    "ancient Greece", "cryptography", "hot air balloons", "the Himalayas", "batteries", "frogs",
    "the moon landing", "knitting", "the Amazon rainforest", "geysers", "the Samurai", "submarines",
    "blood types", "the compass", "marathons", "honey", "the Mediterranean diet", "eclipses",
    "skyscrapers", "the Gold Rush", "magnets", "jellyfish", "windmills", "the human brain",
    "social media", "the Titanic", "bees and pollination", "the metric system", "the Beatles",
    "ancient Rome", "kangaroos", "the stars", "the Andes", "public transport", "paper making",
    "the microscope", "rivers", "the Greek myths", "antibiotics", "astronauts", "the seasons",
    "deep sea creatures", "the Statue of Liberty", "algebra", "composting", "glass making",
    "the Ottoman Empire", "fireflies", "the human skeleton", "wildfires", "cloud computing",
    "the Mongol Empire", "carnivorous plants", "sign language", "the Sun", "minimalism",
    "artificial intelligence", "the Panama Canal", "tigers", "perfume", "the Renaissance painters",
    "video games", "bridges", "the Dead Sea", "hibernation", "the Incas", "electricity",
    "rock climbing", "pandas", "the Hubble telescope", "chess openings", "olive oil", "storms",
    "machine learning", "the postal service", "ants", "the Great Fire of London", "satellites",
    "saving money", "time zones", "the Colosseum", "mushrooms", "fossils", "the Atlantic Ocean",
    "lighthouses", "swimming", "the guitar", "birds migrating", "clouds", "gravity", "pizza",
    "the Louvre", "soap", "sea turtles", "the Roman Empire", "rainforests", "meditation",
]

TASKS = [
    ("explanation", "Explain {t} in simple terms."),
    ("explanation", "Give me a short overview of {t}."),
    ("explanation", "What is the history of {t}?"),
    ("explanation", "Describe {t} in a few sentences."),
    ("explanation", "Explain {t} to a ten-year-old."),
    ("explanation", "Why is {t} important?"),
    ("explanation", "How would you explain {t} to someone who has never heard of it?"),
    ("explanation", "What should everyone know about {t}?"),
    ("lists", "List five interesting facts about {t}."),
    ("lists", "Give me three key points about {t}."),
    ("lists", "What are some common misconceptions about {t}?"),
    ("lists", "List the pros and cons of {t}."),
    ("lists", "Give me a bulleted list of things to know about {t}."),
    ("lists", "Name three books or resources for learning about {t}."),
    ("qa", "How does {t} affect everyday life?"),
    ("qa", "What would happen without {t}?"),
    ("qa", "What is the most surprising thing about {t}?"),
    ("qa", "How has {t} changed over time?"),
    ("qa", "Who should learn about {t}, and why?"),
    ("writing", "Write a haiku about {t}."),
    ("writing", "Write a short poem about {t}."),
    ("writing", "Write a tweet about {t}."),
    ("writing", "Write a short story that involves {t}."),
    ("writing", "Write a short paragraph about {t}."),
    ("writing", "Write a limerick about {t}."),
    ("writing", "Write a product description for a museum exhibit about {t}."),
    ("writing", "Write the opening lines of a documentary script about {t}."),
    ("writing", "Write a short dialogue between two friends talking about {t}."),
    ("writing", "Write a catchy slogan about {t}."),
    ("compare", "Compare {t} and {u}."),
    ("compare", "What do {t} and {u} have in common?"),
]

CHAT = [
    "Hi! How are you today?", "Can you help me plan a weekend trip?", "What should I cook for dinner tonight?",
    "I feel tired all the time. Any tips?", "How can I be more productive when working from home?",
    "What's a good way to start learning a new language?", "Can you suggest a hobby I could pick up?",
    "How do I make friends in a new city?", "What are some good habits for a morning routine?",
    "How can I stay motivated to exercise?", "Can you recommend a good book to read?",
    "What's the best way to prepare for a job interview?", "How do I keep my houseplants alive?",
    "Give me some ideas for a birthday party.", "How can I reduce stress before exams?",
    "What are some tips for saving money on groceries?", "How should I organise my desk?",
    "Can you help me write a thank-you note to a colleague?", "What are fun things to do on a rainy day?",
    "How do I ask my boss for a raise?", "What's a healthy breakfast I can make quickly?",
    "How can I improve my handwriting?", "Can you give me tips for a first date?",
    "How do I start running if I have never run before?", "What should I pack for a beach holiday?",
    "How can I sleep better at night?", "Hello! Tell me something interesting.",
    "What's a good gift for my grandmother?", "How can I learn to cook?", "How do I get better at chess?",
    "I'm bored. What should I do?", "Can you tell me a joke?", "How do I write a good cover letter?",
    "How can I be a better listener?", "What are good ways to spend time with my kids?",
    "How do I clean a cast iron pan?", "What should I name my new cat?", "How do I budget my salary?",
    "Can you help me choose between a laptop and a tablet?", "How can I drink more water during the day?",
]

CODE = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that finds the largest number in a list.",
    "Write a Python function that removes duplicates from a list while keeping order.",
    "Write a Python function that checks if a string is a palindrome.",
    "Write a Python function that computes the Fibonacci numbers up to n.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that counts how often each word appears in a text.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that sorts a list of dictionaries by a key.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that reads a text file and returns its lines.",
    "Write a JavaScript function that capitalizes the first letter of each word.",
    "Write a SQL query that selects all users older than 30.",
    "How do I read a CSV file in Python?", "How do I reverse a list in Python?",
    "What is the difference between a list and a tuple in Python?", "Explain what a for loop does.",
    "Explain recursion with an example.", "What is a dictionary in Python?", "Explain what an API is.",
    "What does the 'self' keyword mean in Python?", "Explain the difference between git merge and git rebase.",
    "How do I handle exceptions in Python?", "What is a binary search?", "Explain what a linked list is.",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that returns the sum of the digits of a number.",
    "Explain what Big O notation means.", "What is the difference between == and is in Python?",
    "Write a bash command that counts the lines in a file.", "How do I create a virtual environment in Python?",
    "Write a Python function that merges two dictionaries.", "Explain what a stack is.",
]

SENTENCES = [
    "The weather is beautiful today.", "I would like a cup of coffee, please.", "Where is the train station?",
    "My sister works at the hospital.", "We are going to the beach this weekend.", "This book is very interesting.",
    "The children are playing in the garden.", "Can you help me find my keys?", "I have lived here for ten years.",
    "The museum is closed on Mondays.", "He is learning to play the guitar.", "Thank you for your help.",
    "The restaurant serves delicious food.", "I forgot my umbrella at home.", "Our meeting starts at three o'clock.",
    "She bought a new bicycle yesterday.", "The cat is sleeping on the sofa.", "How much does this shirt cost?",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]

FOLLOW_UPS = [
    "Can you give me an example?", "Can you make that shorter?", "Why is that?", "Tell me more.",
    "Can you explain that to a child?", "Thanks! Can you summarise that in one sentence?",
    "What is the most important point?", "Can you put that in a list?",
]


def _maths(rng: random.Random) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    price, count = rng.randint(2, 15), rng.randint(2, 12)
    percent, whole = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]), rng.randrange(40, 1000, 10)
    item = rng.choice(["apples", "notebooks", "tickets", "cookies", "markers", "bottles of water", "stamps"])
    return rng.choice([
        f"What is {a} plus {b}?", f"What is {a} times {b}?", f"What is {a * b} divided by {b}?",
        f"What is {percent}% of {whole}?", f"What is {max(a, b)} minus {min(a, b)}?",
        f"A shop sells {item} for {price} dollars each. How much do {count} {item} cost?",
        f"Tom has {a} {item} and gives away {min(a, b) // 2}. How many does he have left?",
        f"A train travels {a * 10} kilometres in {count} hours. What is its average speed?",
        f"If a rectangle is {a} cm long and {b} cm wide, what is its area?",
        f"What is the square of {a}?", f"Is {a * 2 + 1} a prime number?",
    ])


def heldout_prompts() -> list[str]:
    data = resources.files("specdemo").joinpath("training/data/heldout_prompts.jsonl")
    return [json.loads(line)["prompt"] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]


def written_prompts() -> list[str]:
    data = resources.files("specdemo").joinpath("training/data/train_prompts.jsonl")
    return [json.loads(line)["prompt"] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]


def _heldout_topics(heldout: list[str]) -> set[str]:
    """The subjects the held-out prompts ask about, read off the templates they follow."""
    topics = set()
    for prompt in heldout:
        for _, template in TASKS:
            pattern = re.escape(template).replace(r"\{t\}", "(.+)").replace(r"\{u\}", "(.+)")
            match = re.fullmatch(pattern, prompt)
            if match:
                topics.update(g.lower() for g in match.groups())
        match = re.fullmatch(r"What is (.+)\?", prompt)
        if match:
            topics.add(match.group(1).lower())
    return topics


def build_prompts(count: int, seed: int = 0) -> list[dict]:
    """`count` distinct single-turn requests ({"category", "messages"}), shuffled, none held out."""
    rng = random.Random(seed)
    heldout = heldout_prompts()
    banned_topics = _heldout_topics(heldout)
    banned = {p.strip().lower() for p in heldout}
    topics = [t for t in TOPICS if t.lower() not in banned_topics]
    pool: dict[str, str] = {}

    def offer(category: str, text: str) -> None:
        key = text.strip().lower()
        if key in banned or any(topic in key for topic in banned_topics if len(topic) > 3):
            return
        pool.setdefault(text, category)

    for text in written_prompts():
        offer("written", text)
    for text in CHAT + CODE:
        offer("chat" if text in CHAT else "code", text)
    for sentence in SENTENCES:
        for language in LANGUAGES:
            offer("translation", f"Translate to {language}: {sentence}")
    combos = [(category, template, topic) for category, template in TASKS for topic in topics]
    rng.shuffle(combos)
    for category, template, topic in combos:
        other = rng.choice([t for t in topics if t != topic])
        offer(category, template.format(t=topic, u=other))
    for _ in range(max(0, count // 8)):
        offer("maths", _maths(rng))
    items = list(pool.items())
    rng.shuffle(items)
    return [{"category": c, "messages": [{"role": "user", "content": t}]} for t, c in items[:count]]


def follow_up(messages: list[dict], answer: str, rng: random.Random) -> dict:
    """A second turn on a finished exchange: the target answered, the user asks on."""
    turns = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
    return {"category": "multi-turn", "messages": turns}


def summarise(passage: str, rng: random.Random) -> dict:
    """A summarisation request over a passage the target wrote itself."""
    ask = rng.choice([
        "Summarize the following text in one sentence:", "Summarise this in two sentences:",
        "What is the main idea of this text?", "Give a short summary of the following:",
    ])
    return {"category": "summarisation", "messages": [{"role": "user", "content": f"{ask}\n\n{passage}"}]}


# Questions any passage can answer, asked as a retrieval prompt asks them: the answer has to be
# read off the given text, which the summaries and follow-ups alone never demand.
PASSAGE_QUESTIONS = [
    "What is the text mainly about?", "Which two details does the text give? Quote them.",
    "What example does the text use, if any?", "What does the text say first, and what does it say last?",
    "According to the text, why does this matter?",
    "Which words in the text name a number, a place or a person? Quote them, or say there are none.",
]
PASSAGE_INSTRUCTIONS = [
    "Answer the question using only the context below.",
    "Read the context and answer from it alone. Quote the words you rely on.",
    "Use the passage to answer. If the passage does not say, reply that it does not say.",
]


def passage_question(passage: str, rng: random.Random) -> dict:
    """A question to be answered from a passage the target wrote itself, in a retrieval prompt's shape."""
    ask, question = rng.choice(PASSAGE_INSTRUCTIONS), rng.choice(PASSAGE_QUESTIONS)
    content = f"{ask}\n\nContext:\n{passage}\n\nQuestion: {question}"
    return {"category": "rag", "messages": [{"role": "user", "content": content}]}


def passage_translation(passage: str, rng: random.Random) -> dict:
    """A translation of running text (the passage's first sentences), not of one template sentence."""
    sentences = re.split(r"(?<=[.!?])\s+", passage.strip())
    excerpt = " ".join(sentences[: rng.choice([1, 2, 3])])
    language = rng.choice(LANGUAGES)
    ask = rng.choice([f"Translate into {language}:", f"Translate this text into {language}:",
                      f"Please translate the following into {language}."])
    return {"category": "translation", "messages": [{"role": "user", "content": f"{ask}\n\n{excerpt}"}]}


# Who asks, and in which shape: crossed with the request kinds, they make the target write
# requests that no template produces (persona-driven self-instruct).
PERSONAS = [
    "a nurse on a night shift", "a retired carpenter", "a first-year law student", "a bakery owner",
    "a teenager learning to code", "a high-school chemistry teacher", "a long-distance truck driver",
    "a museum guide", "a new parent", "a freelance translator", "a farmer planning next season",
    "a hobby astronomer", "a small-town librarian", "a marathon runner", "a game designer",
    "a city bus mechanic", "a graduate student in linguistics", "a wedding planner", "a beekeeper",
    "a software tester", "a travel blogger", "an accountant at tax time", "a community gardener",
    "a violin student", "a paramedic", "a landlord of two flats", "a data journalist", "a chess coach",
]
FORMATS = [
    "", " and asks for the answer as a numbered list", " and asks for a table", " and asks for one short paragraph",
    " and asks for a step-by-step plan", " and asks for an email draft", " and asks for a short poem",
    " and asks for a JSON object", " and asks for three options with pros and cons", " and asks for a one-line answer",
    " and asks for an example", " and asks for a comparison",
]


def persona_ask(rng: random.Random, kind: str, example: str) -> str:
    """A request to the target to write a new user request, as someone particular would ask it."""
    return (f"Here is an example of something a user asked an AI assistant: \"{example}\"\n"
            f"Now imagine {rng.choice(PERSONAS)}. Write {kind} this person might ask an AI assistant"
            f"{rng.choice(FORMATS)}, on a subject of their own life or work. Reply with the new request only.")


def shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    """The word n-grams of a request, lower-cased without punctuation (the whole text if shorter)."""
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


class NearDuplicates:
    """Requests seen so far, to refuse one whose word 3-grams overlap an earlier one's by at least
    `threshold` (Jaccard): templated rewrites of the same request add little to learn from."""

    def __init__(self, threshold: float = 0.5):
        self.threshold = threshold
        self.sets: list[set] = []
        self.index: dict[tuple, list[int]] = {}

    def add(self, text: str) -> None:
        grams = shingles(text)
        for gram in grams:
            self.index.setdefault(gram, []).append(len(self.sets))
        self.sets.append(grams)

    def is_near(self, text: str) -> bool:
        grams = shingles(text)
        shared: dict[int, int] = {}
        for gram in grams:
            for i in self.index.get(gram, ()):
                shared[i] = shared.get(i, 0) + 1
        return any(common / (len(grams) + len(self.sets[i]) - common) >= self.threshold
                   for i, common in shared.items())
