"""Free-form programming prompts for the synthetic source: SQL, shell, JavaScript and C++ tasks and
Python class / file-handling designs, each with randomised names, columns, paths and numbers.

All wording was written for this project. Each `render_*(rng)` returns one prompt text.
"""
from __future__ import annotations

import random

from dflash2.data.synthetic.tasks import WORDS

_DIALECTS = ("SQL ", "SQL ", "PostgreSQL ", "MySQL ", "SQLite ")
_DEPTS = ("Sales", "Engineering", "Support", "Marketing", "Finance", "Research", "Legal", "Operations")
_CITIES = ("Lisbon", "Osaka", "Nairobi", "Denver", "Krakow", "Lima", "Perth", "Montreal", "Seoul", "Accra")
_CATEGORIES = ("garden", "toys", "kitchen", "books", "sports", "office", "audio", "pets")
_LEADS = ("", "", "", "Could you help? ", "Quick one: ", "I'm stuck on this. ", "For a side project: ",
          "Interview practice: ")
_GENERAL = ("Explain the code briefly afterwards.", "Keep it short.", "Add comments to the tricky parts.",
            "Show an example of using it.", "Mention any edge cases you handle.", "Please keep it dependency-free.",
            "Walk me through your approach first.", "Point out the time complexity.")
_BY_LANG = {
    "python": ("Add type hints.", "Include docstrings.", "Write a couple of pytest tests too.",
               "Use only the standard library.", "Target Python 3.10 or newer.", "Make it easy to extend."),
    "js": ("Use modern ES modules.", "Add JSDoc comments.", "Make it work in Node and in the browser.",
           "Write it in TypeScript if that is easier.", "Avoid external packages."),
    "cpp": ("Use C++17.", "Avoid raw new and delete.", "Compile cleanly with -Wall -Wextra.",
            "Prefer the standard library to hand-written containers.", "Add a small main() to demonstrate it."),
    "shell": ("It should work with POSIX sh, not only bash.", "Make it safe for file names with spaces.",
              "Add set -euo pipefail and explain it.", "Explain each part of the command.",
              "It must run on both Linux and macOS."),
}


def _dress(r: random.Random, text: str, lang: str) -> str:
    """`text` with a random lead-in and up to two extra requirements."""
    extras = r.sample(_BY_LANG[lang] + _GENERAL, r.choice((0, 1, 1, 2, 2)))
    return r.choice(_LEADS) + text + "".join(" " + e for e in extras)


def _tables(r: random.Random, kind: str) -> str:
    emp, cust = r.choice(("employees", "staff", "team_members")), r.choice(("customers", "clients", "buyers"))
    return {"emp": f"`{emp}(id, name, department, salary, hire_date)`",
            "orders": f"`{cust}(id, name, email, city)` and `orders(id, {cust[:-1]}_id, amount, created_at)`",
            "products": f"`{r.choice(('products', 'items', 'catalog'))}(id, name, category, price, stock)`",
            "scores": f"`students(id, name)` and `{r.choice(('results', 'scores', 'grades'))}(student_id, course, score)`"}[kind]


def render_sql(r: random.Random) -> str:
    n, k, year, pct = r.randint(3, 10), r.randint(2, 6), r.randint(2015, 2025), r.choice((5, 8, 10, 12, 15, 20))
    dept, city, cat = r.choice(_DEPTS), r.choice(_CITIES), r.choice(_CATEGORIES)
    kind, task = r.choice((
        ("emp", f"lists the {n} highest-paid people in the {dept} department, highest salary first"),
        ("emp", f"returns each department's average salary, rounded to two decimals, for departments with at "
                f"least {k} people"),
        ("emp", "finds the second highest distinct salary without using LIMIT with OFFSET"),
        ("emp", f"counts how many people were hired in each year since {year}, including years with none"),
        ("emp", f"shows, for each department, the person who has worked there longest (ties broken by name)"),
        ("orders", "shows every customer with the total amount of their orders, showing 0 for customers with none"),
        ("orders", f"lists the customers from {city} who have placed more than {k} orders"),
        ("orders", "finds the customers who have never placed an order"),
        ("orders", f"returns the total order amount for each month of {year}, in month order"),
        ("orders", "computes a running total of order amounts by date with a window function"),
        ("orders", "deletes duplicate customers that share an email address, keeping the row with the lowest id"),
        ("products", f"lists the products in the '{cat}' category with fewer than {n * 5} in stock, cheapest first"),
        ("products", f"raises the price of every product in the '{cat}' category by {pct}%"),
        ("products", f"returns the {k} most expensive products of each category"),
        ("scores", "ranks the students by average score within each course, using a window function"),
        ("scores", f"finds the students whose score in every course they took is at least {50 + 5 * k}"),
        ("scores", "shows the top scorer of each course together with the score")))
    lead = r.choice((f"Given {_tables(r, kind)}, write a {r.choice(_DIALECTS)}query that {task}.",
                     f"I have the table(s) {_tables(r, kind)}. How do I write a query that {task}?",
                     f"Schema: {_tables(r, kind)}. I need a {r.choice(_DIALECTS)}query that {task}."))
    return r.choice(_LEADS) + lead + r.choice(("", "", " Explain the query briefly.", " Avoid subqueries if you can.",
                                               " Suggest an index that would help.", " Use CTEs for readability."))


def render_shell(r: random.Random) -> str:
    ext, src, n = r.choice(("log", "csv", "txt", "json", "jpg", "png")), r.choice(("py", "js", "go", "md", "yaml")), r.randint(2, 30)
    folder, dest = r.choice(("~/projects", "/var/log", "./data", "~/Downloads", "/srv/app")), r.choice(("/backup", "~/archive"))
    word, other = r.sample(WORDS, 2)
    return _dress(r, r.choice((
        f"Write a bash one-liner that finds all .{ext} files under {folder} modified in the last {n} days and "
        f"prints their sizes in human-readable form.",
        f"Write a shell script that backs up {folder} into a timestamped .tar.gz in {dest} and deletes archives "
        f"there that are older than {n} days.",
        f"Using awk, print the {n} most frequent IP addresses in access.log, where the IP is the first field of "
        f"each line.",
        f"Write a bash loop that renames every .{ext} file in the current directory to lower case, skipping names "
        f"that would clash.",
        f"How do I replace every occurrence of '{word}' with '{other}' in all .{src} files under {folder} using sed?",
        f"Write a bash script that checks whether a process called {word}d is running and starts it if not, so "
        f"that it can be run from cron every {n} minutes.",
        f"Count the lines in all .{src} files in a git repository, excluding the {other}/ directory.",
        f"Write a bash script that takes a CSV file as its argument and prints the sum of column {n % 6 + 1}, "
        f"skipping the header line.",
        f"Show how to list the {n} largest files under {folder} with their sizes using du and sort.",
        f"Write a bash function mk{word} that creates a directory and changes into it, failing cleanly when no "
        f"name is given.",
        f"Write a shell script that retries a command up to {n % 7 + 2} times with a {n}-second pause between "
        f"attempts and exits with the command's status.")), "shell")


def _cls(r: random.Random, *options: str) -> str:
    return r.choice(options)


def render_js_spec(r: random.Random) -> str:
    n, word = r.randint(2, 9), r.choice(WORDS)
    return _dress(r, r.choice((
        f"Write a JavaScript `debounce(fn, wait)` helper and show how to use it to delay a search request "
        f"until the user stops typing for {n * 100} ms.",
        f"Implement `throttle(fn, interval)` in JavaScript so that `fn` runs at most once every {n * 50} ms.",
        f"Write a JavaScript function `deepClone(value)` that copies nested objects, arrays and Date values "
        f"without using structuredClone.",
        f"Write a JavaScript function that groups an array of objects by the value of a given key, for example "
        f"grouping {word} records by `category`.",
        f"Write `flattenObject(obj)` in JavaScript: nested keys become dotted paths, e.g. "
        f"{{a: {{b: {n}}}}} becomes {{'a.b': {n}}}.",
        f"Write an async JavaScript function that fetches a JSON URL and retries up to {n} times with "
        f"exponential backoff when the request fails.",
        f"Write a JavaScript function that runs an array of async tasks with at most {n} running at the same "
        f"time and resolves with their results in order.",
        f"Implement a small `EventEmitter` class in JavaScript with `on`, `off`, `once` and `emit`.",
        f"Write a `memoize(fn)` function in JavaScript that caches results by the JSON form of the arguments.",
        f"Add a click handler to every button with the class `{word}-toggle` that toggles the class `active` on "
        f"its parent element, using plain DOM APIs.",
        f"In TypeScript, write a generic function `partition<T>(items: T[], pred: (x: T) => boolean)` that "
        f"returns a pair of arrays.")), "js")


def render_cpp_spec(r: random.Random) -> str:
    n, word = r.randint(2, 64), r.choice(WORDS)
    return _dress(r, r.choice((
        f"Write a C++ class template `RingBuffer<T, N>` with push, pop, and a full() check, and test it with "
        f"N = {n}.",
        "Write a C++ program that reads integers from standard input until EOF and prints their mean and median.",
        "Write a C++ program that counts word frequencies from standard input with std::unordered_map and "
        "prints them sorted by count, then alphabetically.",
        f"Implement a thread-safe counter in C++ using std::mutex, and start {n % 8 + 2} threads that each "
        f"increment it 1000 times.",
        f"Implement a singly linked list of {word} names in C++ with push_front, reverse and print, managing "
        f"memory with std::unique_ptr.",
        "Write a C++ binary search tree with insert, contains and an in-order traversal that fills a "
        "std::vector.",
        "Write a C++ function that splits a CSV line into fields, handling quoted fields that contain commas.",
        f"Write a small C++ 2D `Matrix` class with operator+ and operator*, and multiply two {n % 4 + 2}x"
        f"{n % 4 + 2} matrices in main().")), "cpp")


def render_design(r: random.Random) -> str:
    n = r.randint(2, 20)
    thing = r.choice(("book", "ticket", "order", "song", "task", "parcel"))
    csv_name, cols, group, value = r.choice((
        ("sales.csv", "region, product, units, revenue", "region", "revenue"),
        ("grades.csv", "student, subject, score", "subject", "score"),
        ("trips.csv", "driver, city, distance_km, fare", "city", "fare"),
        ("weather.csv", "station, date, temp_c, rain_mm", "station", "rain_mm")))
    return _dress(r, r.choice((
        f"Write a Python class `{_cls(r, 'Stack', 'LifoStack', 'PlateStack')}` with push, pop, peek and "
        f"is_empty; popping an empty stack should raise IndexError.",
        f"Implement a queue in Python using two stacks, with enqueue and dequeue in amortised O(1) time.",
        f"Write a Python class `{_cls(r, 'BankAccount', 'Wallet', 'SavingsAccount')}` with deposit, withdraw "
        f"(raising ValueError on overdraft) and a history of the last {n} transactions.",
        f"Implement an LRU cache class in Python with get and put, holding at most {n} items, without using "
        f"functools.lru_cache.",
        f"Write a Python class `{_cls(r, 'Inventory', 'Stockroom', 'Pantry')}` that tracks {thing} quantities, "
        f"with add, remove and a method listing items with fewer than {n} left.",
        "Write a Python class `Temperature` that stores Celsius and exposes a `fahrenheit` property with a "
        "setter.",
        f"Write a Python dataclass `{thing.title()}` with a name, a price and a quantity, and a function that "
        f"sorts a list of them by price and then by name.",
        "Write a Python `Graph` class with an adjacency list, add_edge, a breadth-first traversal from a start "
        "node and a has_path(a, b) method.",
        f"Write a Python `RateLimiter` class that allows at most {n} calls per minute per user id.",
        "Write a Python context manager that measures how long its block takes and logs it.",
        f"Write a Python script that reads `{csv_name}` (columns: {cols}) and prints the average {value} for each "
        f"{group}, sorted from highest to lowest.",
        f"Write a Python function that loads `{csv_name}` (columns: {cols}) with csv.DictReader and returns the "
        f"row with the largest {value}.",
        "Write a Python function that returns the number of non-empty lines in a text file, reading it lazily.",
        f"Write a Python function `tail(path, n)` that returns the last n lines of a file without reading the "
        f"whole file into memory; use n = {n} in an example.",
        f"Write a Python script that walks a directory tree and prints the {n} largest files with their sizes.",
        "Write a Python function that finds duplicate files in a folder by comparing SHA-256 hashes.",
        f"Write a Python script that reads a JSON list of {thing} records and writes them to a CSV file, one "
        f"column per key.",
        "Write a Python script that reads a log file whose lines start with a timestamp such as "
        "'2024-03-01 14:22:05' and counts the ERROR lines per hour.",
        f"Write a command-line tool with argparse that adds a date prefix to every .{_cls(r, 'jpg', 'pdf', 'txt')} "
        f"file in a folder, with a --dry-run flag.")), "python")
