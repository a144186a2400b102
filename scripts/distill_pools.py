"""Subjects for the chat task families of ``distill_tasks.py``. None may name a subject of the held-out benchmark
set (``assets/prompts/chat.jsonl``); ``make_distill_prompts.py`` drops any prompt that does anyway."""

PHENOMENA = [
    "ice floats on water", "the sea is salty", "we have seasons", "bread rises", "metal feels colder than wood",
    "the Moon changes shape", "we yawn", "onions make people cry", "planes can fly", "stars twinkle",
    "soap removes grease", "leaves are green", "rainbows appear after rain", "we get goosebumps",
    "the sunset looks red", "thunder follows lightning", "hot air rises", "salt melts ice on roads",
    "our ears pop on a plane", "popcorn pops", "dough needs to rest", "glass is transparent",
    "some people are left-handed", "we need to drink water", "deserts are cold at night",
    "mountains have snow on top", "boats float", "magnets stick to the fridge", "a spoon looks bent in water",
    "we see our breath in winter", "the tide goes in and out", "batteries run down", "apples turn brown when cut",
    "coffee keeps people awake", "we have fingerprints", "cats land on their feet", "the ocean has waves",
    "birds migrate", "fireworks have different colours", "a compass points north", "honey never spoils",
    "our voices sound different on recordings", "the Earth is round", "ice cubes crack in a drink",
    "some days feel longer than others", "wet sand is darker than dry sand", "a balloon sticks to a wall after "
    "rubbing it on hair", "bubbles are round", "our hearts beat faster when we run", "deserts have few plants",
]
DEVICES = [
    "a car engine", "a refrigerator", "an airplane wing", "a rocket", "a computer", "a telephone", "an elevator",
    "a mechanical clock", "a camera", "a solar panel", "a wind turbine", "a flushing toilet", "a light bulb",
    "a lock and key", "a thermometer", "a vacuum cleaner", "a dishwasher", "a washing machine", "a kettle",
    "a submarine", "a hot air balloon", "a parachute", "a bridge", "a dam", "a traffic light", "a zipper",
    "a pencil sharpener", "a lighthouse", "a helicopter", "a printer", "a radio", "a television", "an escalator",
    "a heat pump", "a smoke detector", "a piano", "an electric guitar", "a telescope", "a microscope",
    "a credit card", "a barcode scanner", "a sailboat", "a pulley", "a lever", "a water filter", "a ballpoint pen",
]
TOPICS = [
    "the sea", "a rainy afternoon", "a lighthouse", "the first day of spring", "a cup of tea", "an old library",
    "the mountains", "a busy train station", "a fox in the snow", "a snowy village", "a summer festival", "the desert",
    "a lost key", "friendship", "a new job", "the city at dawn", "a cat on a windowsill", "a candle", "the wind",
    "a garden in June", "a robot learning to paint", "the last day of school", "a thunderstorm", "a long journey",
    "the stars", "a river", "an empty beach", "a grandfather's watch", "a dragon who is afraid of the dark",
    "a penguin who wants to fly", "a kind stranger", "the smell of rain", "a rainy Monday", "coffee",
    "a school trip", "a birthday surprise", "a tiny mouse", "the ocean floor", "a hot day", "an old map",
    "winter mornings", "a forest path", "the night train", "a baker's morning", "a brave little boat",
]
HOBBIES = [
    "running", "learning to draw", "playing the guitar", "gardening", "learning Spanish", "photography",
    "playing chess", "writing a novel", "baking bread", "swimming", "learning to code", "knitting", "yoga",
    "public speaking", "birdwatching", "rock climbing", "painting with watercolours", "playing the piano",
    "saving money", "studying for exams", "learning to dance", "keeping a journal", "hiking", "cycling to work",
    "making pottery", "learning to juggle", "meditation", "writing poetry", "playing tennis", "home workouts",
    "camping", "fishing", "learning to sew", "building furniture", "growing tomatoes", "speed reading",
    "learning magic tricks", "playing football", "skateboarding", "learning sign language", "making videos",
    "starting a podcast", "volunteering", "learning to type faster", "keeping houseplants", "learning to sing",
]
LIST_REQUESTS = [
    "vegetables that are high in iron", "countries in South America", "instruments in an orchestra",
    "planets in the solar system", "famous scientists", "board games for families", "healthy breakfast ideas",
    "animals that live in the Arctic", "ways to save energy at home", "books every teenager should read",
    "programming languages for beginners", "things to pack for a camping trip", "ways to reduce plastic waste",
    "dog breeds that are good with children", "sports played with a ball", "inventions that changed the world",
    "common houseplants", "rivers in Africa", "ways to stay motivated", "foods that are high in protein",
    "questions to ask in a job interview", "ideas for a rainy day", "ancient wonders of the world",
    "birds that cannot fly", "habits of successful people", "colours of the rainbow", "types of clouds",
    "European capitals", "ways to be more productive", "easy dinner ideas", "fun facts about octopuses",
    "gifts for a ten-year-old", "herbs you can grow indoors", "signs of dehydration", "mammals that live in the sea",
]
CODE_TASKS = [
    "reverses a string", "counts the words in a sentence", "returns the largest number in a list",
    "checks whether a number is prime", "computes the factorial of a number", "returns the n-th Fibonacci number",
    "removes duplicates from a list", "sorts a list of names alphabetically", "converts Celsius to Fahrenheit",
    "finds the average of a list of numbers", "merges two sorted lists", "checks whether a year is a leap year",
    "counts how often each letter appears in a string", "checks whether two words are anagrams",
    "reads a CSV file and prints the first five rows", "finds the longest word in a sentence",
    "returns the sum of the even numbers in a list", "converts a number to binary", "validates an email address",
    "generates a random password", "implements binary search", "flattens a nested list", "computes a square root",
    "returns the common elements of two lists", "capitalizes the first letter of each word",
    "counts the lines in a text file", "converts a list of strings to integers", "finds the median of a list",
    "checks whether a string contains only digits", "swaps two variables", "prints a multiplication table",
    "computes compound interest", "returns the index of the smallest element", "rotates a list by k places",
]
PROGRAMMING_PAIRS = [
    ("a list", "a set"), ("a dictionary", "a list"), ("a for loop", "a while loop"), ("a class", "an object"),
    ("a function", "a method"), ("a compiler", "an interpreter"), ("a stack", "a queue"), ("git merge", "git rebase"),
    ("HTTP", "HTTPS"), ("RAM", "disk storage"), ("== in Python", "is in Python"), ("an array", "a linked list"),
    ("SQL", "NoSQL databases"), ("a process", "a thread"), ("TCP", "UDP"), ("static typing", "dynamic typing"),
    ("a library", "a framework"), ("an integer", "a float"), ("recursion", "iteration"), ("a bug", "an error"),
    ("front-end", "back-end development"), ("JavaScript", "Java"), ("a variable", "a constant"),
    ("pass by value", "pass by reference"), ("a GET request", "a POST request"), ("unit tests", "integration tests"),
]
COMPARE_PAIRS = [
    ("weather", "climate"), ("a virus", "bacteria"), ("an alligator", "a crocodile"), ("baking soda", "baking powder"),
    ("latitude", "longitude"), ("speed", "velocity"), ("mass", "weight"), ("a frog", "a toad"), ("a lake", "a pond"),
    ("a hurricane", "a tornado"), ("empathy", "sympathy"), ("a republic", "a democracy"), ("a star", "a planet"),
    ("an ocean", "a sea"), ("a moth", "a butterfly"), ("renting", "buying a home"), ("tea", "coffee"),
    ("a dolphin", "a porpoise"), ("a rabbit", "a hare"), ("an asteroid", "a comet"), ("a fruit", "a vegetable"),
    ("a poem", "a song"), ("saving", "investing"), ("a college", "a university"), ("an ape", "a monkey"),
    ("a mountain", "a hill"), ("affect", "effect"), ("a simile", "a metaphor"), ("a debit card", "a credit card"),
]
PHRASES = [
    "Thank you very much", "Where is the train station?", "I would like a coffee, please", "What time is it?",
    "Nice to meet you", "Happy birthday", "See you tomorrow", "How much does this cost?", "I am lost",
    "Can you help me?", "The weather is lovely today", "I don't understand", "Where is the bathroom?",
    "I love learning languages", "Have a nice day", "My name is Anna", "Excuse me, where is the museum?",
    "I am hungry", "Good night and sweet dreams", "Please speak more slowly",
]
LANGUAGES = ["Spanish", "German", "Portuguese", "Dutch", "Japanese", "Swedish", "Polish", "Greek", "Turkish"]
BUSINESSES = [
    "a small coffee shop by the sea", "a second-hand bookshop", "a flower shop", "a dog grooming salon",
    "a yoga studio", "a food truck that sells tacos", "a podcast about history", "a repair shop for phones",
    "a children's toy store", "a vegan restaurant", "a tutoring service for maths", "a hiking club",
    "a cleaning company", "an ice cream parlour", "a board game café", "a photography studio",
    "a shop that sells handmade candles", "an online store for houseplants", "a gym for older adults",
    "a mobile app that tracks water intake", "a tea house", "a startup that recycles old clothes",
]
STORIES = [
    "Hamlet", "Macbeth", "Cinderella", "The Odyssey", "Pride and Prejudice", "The Lion King", "Frankenstein",
    "Moby Dick", "Little Red Riding Hood", "The Three Little Pigs", "A Christmas Carol", "Treasure Island",
    "Alice in Wonderland", "The Wizard of Oz", "Robinson Crusoe", "The Little Prince", "Snow White",
    "The Tortoise and the Hare", "Peter Pan", "Jane Eyre", "The Jungle Book", "Beauty and the Beast",
    "Don Quixote", "Goldilocks and the Three Bears", "The Ugly Duckling", "Jack and the Beanstalk",
]
CAUSES = [
    "unemployment", "traffic jams", "deforestation", "air pollution", "obesity", "homelessness", "recessions",
    "wildfires", "soil erosion", "poverty", "stress at work", "food waste", "coral bleaching", "droughts",
    "floods", "loneliness", "rising house prices", "plastic pollution", "noise pollution", "species extinction",
]
ANIMAL_HABITS = [
    "dogs wag their tails", "birds sing in the morning", "bees dance", "wolves howl", "whales sing",
    "geese fly in a V shape", "zebras have stripes", "cows chew all day", "chameleons change colour", "owls hoot",
    "frogs croak", "dogs sniff each other", "squirrels bury nuts", "salmon swim upstream", "bats hang upside down",
    "cats knead with their paws", "parrots copy words", "elephants flap their ears", "flamingos stand on one leg",
    "ants walk in lines", "horses roll in the dust", "fireflies glow", "penguins huddle together",
]
FACT_QUESTIONS = [
    "Who invented the telephone?", "How tall is Mount Everest?", "What is the largest ocean on Earth?",
    "How many bones are in the human body?", "Who painted the Mona Lisa?", "What is the boiling point of water?",
    "How far is the Moon from the Earth?", "What is the longest river in the world?", "Who wrote Hamlet?",
    "How many continents are there?", "What gas do plants take in?", "What is the smallest prime number?",
    "Who was the first person to walk on the Moon?", "What is the chemical symbol for gold?",
    "How many legs does a spider have?", "What is the hardest natural material?", "Who discovered penicillin?",
    "What is the fastest land animal?", "How old is the universe?", "What is the capital of Australia?",
    "What is the largest planet in our solar system?", "How many strings does a violin have?",
    "When did the Second World War end?", "What is the freezing point of water in Fahrenheit?",
    "Who developed the theory of relativity?", "What is the tallest building in the world?",
    "How many players are in a football team?", "What language has the most native speakers?",
    "What is the square root of 144?", "Which planet is known as the Red Planet?",
]
COUNTRIES = [
    "Japan", "Egypt", "Brazil", "Canada", "Kenya", "Norway", "India", "Mexico", "Peru", "Iceland", "Vietnam",
    "Morocco", "Greece", "Chile", "Thailand", "Portugal", "Argentina", "Finland", "New Zealand", "Ireland",
    "South Korea", "Poland", "Ghana", "Colombia", "Indonesia", "Switzerland", "Nepal", "Austria",
]
TOWNS = [
    "Paris", "London", "Barcelona", "Amsterdam", "Tokyo", "New York", "Prague", "Vienna", "Lisbon", "Berlin",
    "Athens", "Istanbul", "Kyoto", "Sydney", "Edinburgh", "Dublin", "Budapest", "Copenhagen", "Seville", "Krakow",
]
WORDS = [
    "serendipity", "ephemeral", "resilient", "ubiquitous", "meticulous", "nostalgia", "pragmatic", "eloquent",
    "ambiguous", "benevolent", "candid", "diligent", "frugal", "gregarious", "hypothesis", "inevitable",
    "lucid", "mundane", "obsolete", "plausible", "quaint", "reluctant", "tedious", "vivid", "whimsical",
]
FIX_SENTENCES = [
    "me and him goes to the shop yesterday", "their going to the park later", "she dont like apples",
    "the results was better then expected", "i has finished my homework", "we was waiting for hours",
    "the meeting have been moved to friday", "your the best friend i ever had", "he runned very fast",
    "can you borrow me a pen", "the data shows that sales has increased", "less people came than last year",
]
EMAILS = [
    "to my manager asking for a day off", "thanking a colleague for their help", "to a teacher about a missed class",
    "inviting friends to a barbecue", "to a landlord about a broken heater", "declining a meeting politely",
    "asking a shop about a late delivery", "congratulating a friend on a new job", "to a client about a delay",
    "apologising for missing a call", "asking for feedback on a report", "welcoming a new team member",
]
