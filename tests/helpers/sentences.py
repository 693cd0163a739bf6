"""Source sentences for the parity tests: very different lengths, one past the tiny models' 64 positions.

The fixtures in conftest.py assert that these give outputs of many lengths on the tiny models (some ending within a
few tokens, some running to the length limit, most longer than 10 tokens), so that "identical to transformers"
covers the cache over many steps and rows leaving a batch at different steps.
"""

SENTENCES = [
    "Hello world.",
    "The river is long and the mountain is high",
    "a",
    "Could these two may first then do any like my now over such our man me even most made after also did many "
    "before must through back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life being under never",
    "Good morning!",
    "What is this?",
    "music",
    "He came from the city with three friends and a green paper for the school market.",
    "Tom is reading a letter from his family.",
    "Where is the doctor?",
    "It was a bright and quiet morning in the old house by the river.",
    "We have to work.",
    "I know.",
    "They made a small garden behind the school, and the children came every evening to see it.",
    "How are you?",
    "The engine is fast.",
]
