"""Number, date, parsing and algorithm tasks for the synthetic prompts (see `tasks.py`).

Written for this project; each reference solution is executed to produce the prompts' examples.
"""
from __future__ import annotations

from dflash2.data.synthetic.tasks import WORDS, Task, _date, _email, _ints, _ip, _letters, _mixcase, _roman, \
    _sent, _word, _words, adder

NUMBER_TASKS: list[Task] = []
_t = adder(NUMBER_TASKS)
# ----------------------------------------------------------------- numbers
_t("is_prime", "n", "checks whether the integer `n` is a prime number", "if n < 2:\n    return False\n"
   "for d in range(2, int(n ** 0.5) + 1):\n    if n % d == 0:\n        return False\nreturn True",
   lambda r: (r.choice((r.randint(0, 100), r.choice((4, 9, 25, 49, 121)), r.choice((2, 3, 13, 97)))),), "check_prime")
_t("gcd", "a, b", "returns the greatest common divisor of two non-negative integers using Euclid's algorithm",
   "while b:\n    a, b = b, a % b\nreturn a", lambda r: (lambda g: (g * r.randint(1, 12), g * r.randint(1, 12)))(r.randint(1, 15)),
   "greatest_common_divisor")
_t("lcm", "a, b", "returns the least common multiple of two positive integers", "from math import gcd\n"
   "return a * b // gcd(a, b)", lambda r: (r.randint(2, 30), r.randint(2, 30)), "least_common_multiple")
_t("factorial", "n", "returns n! (the product 1 * 2 * ... * n) computed recursively, with 0! equal to 1",
   "if n <= 1:\n    return 1\nreturn n * factorial(n - 1)", lambda r: (r.randint(0, 10),), "fact")
_t("fibonacci", "n", "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
   "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a", lambda r: (r.randint(0, 25),), "fib", "nth_fibonacci")
_t("digit_sum", "n", "returns the sum of the decimal digits of the non-negative integer `n`",
   "total = 0\nwhile n > 0:\n    total += n % 10\n    n //= 10\nreturn total", lambda r: (r.randint(0, 99999),), "sum_of_digits")
_t("reverse_digits", "n", "returns the non-negative integer `n` with its decimal digits reversed (so 1200 becomes 21)",
   "return int(str(n)[::-1])", lambda r: (r.randint(0, 9999) * r.choice((1, 1, 10)),), "flip_number")
_t("is_armstrong", "n", "checks whether `n` equals the sum of its digits each raised to the power of the number of "
   "digits", "digits = str(n)\nreturn n == sum(int(d) ** len(digits) for d in digits)",
   lambda r: (r.choice((153, 370, 371, 407, 1634, 8208, r.randint(10, 999), r.randint(100, 9999))),), "is_narcissistic")
_t("prime_factors", "n", "returns the prime factors of `n` (n >= 2) in increasing order, each repeated as often as "
   "it divides `n`", "factors = []\nd = 2\nwhile d * d <= n:\n    while n % d == 0:\n        factors.append(d)\n"
   "        n //= d\n    d += 1\nif n > 1:\n    factors.append(n)\nreturn factors", lambda r: (r.randint(2, 500),), "factorize")
_t("count_divisors", "n", "counts the positive divisors of the positive integer `n`",
   "return sum(1 for d in range(1, n + 1) if n % d == 0)", lambda r: (r.randint(1, 120),), "num_divisors")
_t("is_perfect_square", "n", "checks whether the non-negative integer `n` is a perfect square without using "
   "floating point", "from math import isqrt\nreturn isqrt(n) ** 2 == n",
   lambda r: (r.choice((r.randint(0, 40) ** 2, r.randint(0, 1500))),), "is_square")
_t("fast_power", "base, exp", "computes `base` raised to the non-negative integer `exp` by repeated squaring, "
   "recursively", "if exp == 0:\n    return 1\nhalf = fast_power(base, exp // 2)\nif exp % 2 == 0:\n"
   "    return half * half\nreturn half * half * base", lambda r: (r.randint(-3, 5), r.randint(0, 9)), "power")
_t("binomial", "n, k", "returns the binomial coefficient C(n, k) using Pascal's rule and no imports (0 when k is "
   "outside 0..n)", "row = [1]\nfor _ in range(n):\n    row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]\n"
   "return row[k] if 0 <= k <= n else 0", lambda r: (lambda n: (n, r.randint(-1, n + 1)))(r.randint(0, 12)), "choose")
_t("collatz_steps", "n", "counts the steps the Collatz process (halve an even number, turn an odd n into 3n + 1) "
   "takes to reach 1 from the positive integer `n`", "steps = 0\nwhile n != 1:\n"
   "    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\nreturn steps", lambda r: (r.randint(1, 60),), "collatz_length")
_t("to_binary", "n", "returns the binary digits of the non-negative integer `n` as a string, without bin() or "
   "format()", "if n == 0:\n    return '0'\nbits = ''\nwhile n > 0:\n    bits = str(n % 2) + bits\n    n //= 2\n"
   "return bits", lambda r: (r.randint(0, 300),), "binary_string")
_t("from_binary", "bits", "converts a string of 0s and 1s into the integer it stands for in base 2, without calling "
   "int(bits, 2)", "value = 0\nfor bit in bits:\n    value = value * 2 + (1 if bit == '1' else 0)\nreturn value",
   lambda r: (_letters(r, "01", 1, 9),), "parse_binary")
_t("sum_of_multiples", "limit, a, b", "returns the sum of the positive integers below `limit` that are multiples of "
   "`a` or `b`", "return sum(x for x in range(1, limit) if x % a == 0 or x % b == 0)",
   lambda r: (r.randint(10, 60), r.randint(2, 5), r.randint(3, 7)), "multiples_total")
_t("is_perfect", "n", "checks whether `n` equals the sum of its proper divisors (as 6 = 1 + 2 + 3 does)",
   "return n > 1 and sum(d for d in range(1, n) if n % d == 0) == n",
   lambda r: (r.choice((6, 28, 496, r.randint(1, 100))),), "is_perfect_number")
_t("triangle_kind", "a, b, c", "classifies a triangle by its side lengths, returning 'equilateral', 'isosceles', "
   "'scalene', or 'invalid' when the sides cannot form a triangle", "x, y, z = sorted((a, b, c))\nif x + y <= z:\n"
   "    return 'invalid'\nif x == z:\n    return 'equilateral'\nif x == y or y == z:\n    return 'isosceles'\n"
   "return 'scalene'", lambda r: tuple(r.choice((lambda s: (s, s, s), lambda s: (s, s, s + 1), lambda s: (s, s + 2, s + 3),
                                                lambda s: (s, 1, s + 4)))(r.randint(2, 9))), "classify_triangle")
_t("digital_root", "n", "reduces the non-negative integer `n` to one digit by summing its digits again and again, "
   "and returns that digit", "while n >= 10:\n    n = sum(int(d) for d in str(n))\nreturn n",
   lambda r: (r.randint(0, 999999),), "repeated_digit_sum")
_t("celsius_to_fahrenheit", "celsius", "converts a temperature from degrees Celsius to Fahrenheit, rounded to one "
   "decimal place", "return round(celsius * 9 / 5 + 32, 1)", lambda r: (r.randint(-40, 110),), "c_to_f")
_t("is_leap_year", "year", "checks whether `year` is a leap year in the Gregorian calendar",
   "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
   lambda r: (r.choice((r.randint(1800, 2400), 1900, 2000, 2100, 2024)),), "leap")
_t("triangular", "n", "returns the n-th triangular number, the sum 1 + 2 + ... + n", "return n * (n + 1) // 2",
   lambda r: (r.randint(0, 100),), "triangle_number")
_t("primes_below", "n", "returns all prime numbers less than `n`, found with the sieve of Eratosthenes",
   "if n < 3:\n    return []\nsieve = [True] * n\nsieve[0] = sieve[1] = False\n"
   "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n        for j in range(i * i, n, i):\n"
   "            sieve[j] = False\nreturn [i for i, is_p in enumerate(sieve) if is_p]",
   lambda r: (r.randint(2, 50),), "primes_under")
_t("roman_to_int", "numeral", "converts a Roman numeral such as 'MCMXCIV' into an integer",
   "values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\ntotal = 0\n"
   "for i, ch in enumerate(numeral):\n    if i + 1 < len(numeral) and values[ch] < values[numeral[i + 1]]:\n"
   "        total -= values[ch]\n    else:\n        total += values[ch]\nreturn total",
   lambda r: (_roman(r.randint(1, 3999)),), "parse_roman")
_t("int_to_roman", "number", "converts an integer from 1 to 3999 into a Roman numeral string",
   "pairs = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
   "         (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\nout = ''\n"
   "for value, letters in pairs:\n    while number >= value:\n        out += letters\n        number -= value\n"
   "return out", lambda r: (r.randint(1, 3999),), "to_roman")
_t("is_power_of_two", "n", "checks with bit operations whether the integer `n` is a power of two",
   "return n > 0 and n & (n - 1) == 0", lambda r: (r.choice((2 ** r.randint(0, 12), r.randint(-4, 200))),), "power_of_two")
_t("count_bits", "n", "counts the 1 bits in the binary form of the non-negative integer `n`",
   "count = 0\nwhile n:\n    count += n & 1\n    n >>= 1\nreturn count", lambda r: (r.randint(0, 1000),), "popcount")
_t("dot_product", "a, b", "returns the dot product of two lists of numbers of equal length",
   "return sum(x * y for x, y in zip(a, b))", lambda r: (lambda n: (_ints(r, -5, 9, n, n), _ints(r, -5, 9, n, n)))(r.randint(2, 4)),
   "dot")
_t("closest_to", "nums, target", "returns the value in `nums` closest to `target`, preferring the smaller value on "
   "ties", "return min(nums, key=lambda x: (abs(x - target), x))", lambda r: (_ints(r, 0, 30), r.randint(0, 30)),
   "nearest_value")
_t("final_balance", "transactions", "applies a list of ('deposit' or 'withdraw', amount) pairs to a balance that "
   "starts at 0 and returns the final balance, skipping any withdrawal larger than the current balance",
   "balance = 0\nfor kind, amount in transactions:\n    if kind == 'deposit':\n        balance += amount\n"
   "    elif amount <= balance:\n        balance -= amount\nreturn balance",
   lambda r: ([(r.choice(("deposit", "withdraw")), r.randint(1, 9) * 10) for _ in range(r.randint(2, 5))],), "apply_transactions")
_t("letter_grade", "score", "maps a score from 0 to 100 to a letter grade: 90 and above is 'A', 80 and above 'B', "
   "70 and above 'C', 60 and above 'D', anything lower 'F'", "if score >= 90:\n    return 'A'\nif score >= 80:\n"
   "    return 'B'\nif score >= 70:\n    return 'C'\nif score >= 60:\n    return 'D'\nreturn 'F'",
   lambda r: (r.choice((r.randint(0, 100), r.choice((60, 70, 80, 90)))),), "grade")
_t("fizzbuzz", "n", "returns the FizzBuzz strings for 1 to `n`: 'Fizz' for multiples of 3, 'Buzz' for multiples of "
   "5, 'FizzBuzz' for multiples of both and the number itself otherwise", "out = []\nfor i in range(1, n + 1):\n"
   "    if i % 15 == 0:\n        out.append('FizzBuzz')\n    elif i % 3 == 0:\n        out.append('Fizz')\n"
   "    elif i % 5 == 0:\n        out.append('Buzz')\n    else:\n        out.append(str(i))\nreturn out",
   lambda r: (r.randint(1, 15),), "fizz_buzz_list")
# ----------------------------------------------------------------- dates and parsing
_t("day_of_year", "date_text", "returns the day of the year, from 1 to 366, of a date written as 'YYYY-MM-DD'",
   "from datetime import date\nreturn date.fromisoformat(date_text).timetuple().tm_yday", lambda r: (_date(r),), "ordinal_day")
_t("days_between", "start, end", "returns the number of days from the date `start` to the date `end`, both written "
   "as 'YYYY-MM-DD' (negative if `end` comes first)", "from datetime import date\n"
   "return (date.fromisoformat(end) - date.fromisoformat(start)).days", lambda r: (_date(r), _date(r)), "date_diff")
_t("weekday_name", "date_text", "returns the English weekday name, such as 'Monday', of a date written as "
   "'YYYY-MM-DD'", "from datetime import date\nnames = ['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', "
   "'Saturday', 'Sunday']\nreturn names[date.fromisoformat(date_text).weekday()]", lambda r: (_date(r),), "day_name")
_t("to_minutes", "clock", "converts a time of day written as 'HH:MM' on a 24-hour clock into minutes since midnight",
   "hours, minutes = clock.split(':')\nreturn int(hours) * 60 + int(minutes)",
   lambda r: (f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}",), "minutes_since_midnight")
_t("format_duration", "seconds", "formats a non-negative number of seconds as 'H:MM:SS'",
   "hours, rest = divmod(seconds, 3600)\nminutes, secs = divmod(rest, 60)\nreturn f'{hours}:{minutes:02d}:{secs:02d}'",
   lambda r: (r.randint(0, 40000),), "hms")
_t("parse_pairs", "text", "parses a string such as 'a=1;b=2' into a dictionary of strings, ignoring empty segments "
   "and spaces around keys and values", "result = {}\nfor part in text.split(';'):\n    if part.strip():\n"
   "        key, value = part.split('=', 1)\n        result[key.strip()] = value.strip()\nreturn result",
   lambda r: (";".join(f"{w}={r.randint(0, 99)}" for w in r.sample(WORDS, r.randint(1, 3))) + r.choice(("", ";")),),
   "parse_settings")
_t("split_csv_line", "line", "splits one line of comma-separated values into a list of fields with surrounding "
   "spaces removed (no quoting rules needed)", "return [field.strip() for field in line.split(',')]",
   lambda r: (", ".join(_words(r, 2, 4)) + "," + str(r.randint(1, 99)),), "csv_fields")
_t("extract_integers", "text", "returns every integer (possibly negative) that appears in `text`, in order, as ints",
   "import re\nreturn [int(m) for m in re.findall(r'-?\\d+', text)]",
   lambda r: (f"{_word(r)} {r.randint(-50, 50)} and {r.randint(0, 999)} {_word(r)}s, {r.randint(-9, 9)} left",), "find_numbers")
_t("is_valid_email", "address", "checks whether `address` looks like a simple e-mail address: letters, digits, dots "
   "or underscores, one '@', a domain, and a dot followed by two to six letters",
   "import re\nreturn re.fullmatch(r'[\\w.]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,6}', address) is not None",
   lambda r: (_email(r),), "looks_like_email")
_t("hashtags", "post", "returns the hashtags in `post` (words that start with '#'), lower-cased, without the '#', "
   "in order of appearance", "import re\nreturn [tag.lower() for tag in re.findall(r'#(\\w+)', post)]",
   lambda r: (" ".join(("#" + _mixcase(r, w)) if r.random() < 0.4 else w for w in _words(r, 3, 6)),), "extract_tags")
_t("parse_version", "version", "turns a version string such as '2.10.3' into a tuple of integers",
   "return tuple(int(part) for part in version.split('.'))",
   lambda r: (".".join(str(r.randint(0, 20)) for _ in range(r.randint(1, 4))),), "version_tuple")
_t("compare_versions", "a, b", "compares two dotted version strings numerically and returns -1, 0 or 1 as `a` is "
   "older than, equal to or newer than `b`, treating missing parts as 0", "x = [int(p) for p in a.split('.')]\n"
   "y = [int(p) for p in b.split('.')]\nsize = max(len(x), len(y))\nx += [0] * (size - len(x))\n"
   "y += [0] * (size - len(y))\nreturn (x > y) - (x < y)",
   lambda r: tuple(".".join(str(r.randint(0, 3)) for _ in range(r.randint(1, 3))) for _ in "ab"), "version_cmp")
_t("is_valid_ipv4", "address", "checks whether `address` is a dotted IPv4 address: four decimal numbers from 0 to "
   "255 without leading zeros", "parts = address.split('.')\nif len(parts) != 4:\n    return False\n"
   "for part in parts:\n    if not part.isdigit() or int(part) > 255 or (len(part) > 1 and part[0] == '0'):\n"
   "        return False\nreturn True", lambda r: (_ip(r),), "valid_ip")
_t("query_params", "url", "returns the query parameters of `url` as a dictionary (the last value wins when a name "
   "repeats)", "from urllib.parse import urlsplit, parse_qsl\nreturn dict(parse_qsl(urlsplit(url).query))",
   lambda r: (f"https://{_word(r)}.example/{_word(r)}?" + "&".join(f"{w}={r.randint(0, 9)}" for w in _words(r, 1, 3)),),
   "parse_query")
_t("slugify", "title", "turns `title` into a URL slug: lower case, every run of characters other than letters and "
   "digits replaced by one hyphen, no hyphen at either end", "import re\n"
   "return re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')",
   lambda r: (r.choice(("", "  ")) + "! ".join(_mixcase(r, w) for w in _words(r, 2, 4)) + r.choice(("?", "", " 2")),), "make_slug")
_t("wrap_text", "text, width", "wraps `text` greedily into lines of at most `width` characters, breaking only at "
   "spaces, and returns the lines as a list (a word longer than `width` gets a line of its own)",
   "lines = []\ncurrent = ''\nfor word in text.split():\n    if current and len(current) + 1 + len(word) > width:\n"
   "        lines.append(current)\n        current = word\n    else:\n"
   "        current = current + ' ' + word if current else word\nif current:\n    lines.append(current)\nreturn lines",
   lambda r: (_sent(r, 3, 6), r.randint(6, 16)), "word_wrap")
# ----------------------------------------------------------------- algorithms
_t("binary_search", "items, target", "returns the index of `target` in the sorted list `items` using binary "
   "search, or -1 if it is absent", "low, high = 0, len(items) - 1\nwhile low <= high:\n    mid = (low + high) // 2\n"
   "    if items[mid] == target:\n        return mid\n    if items[mid] < target:\n        low = mid + 1\n"
   "    else:\n        high = mid - 1\nreturn -1",
   lambda r: (lambda xs: (xs, r.choice(xs + [r.randint(0, 40)])))(sorted(r.sample(range(40), r.randint(1, 8)))), "bsearch")
_t("bubble_sort", "nums", "sorts a copy of `nums` into ascending order with bubble sort and returns it",
   "arr = list(nums)\nfor i in range(len(arr)):\n    for j in range(len(arr) - 1 - i):\n        if arr[j] > arr[j + 1]:\n"
   "            arr[j], arr[j + 1] = arr[j + 1], arr[j]\nreturn arr", lambda r: (_ints(r),), "bubble")
_t("insertion_sort", "nums", "returns a new list with the values of `nums` in ascending order, built by insertion "
   "sort", "arr = []\nfor x in nums:\n    i = len(arr)\n    while i > 0 and arr[i - 1] > x:\n        i -= 1\n"
   "    arr.insert(i, x)\nreturn arr", lambda r: (_ints(r),), "insert_sort")
_t("merge_sort", "nums", "sorts `nums` with a recursive merge sort and returns the new sorted list",
   "if len(nums) <= 1:\n    return list(nums)\nmid = len(nums) // 2\nleft, right = merge_sort(nums[:mid]), merge_sort(nums[mid:])\n"
   "merged = []\nwhile left and right:\n    merged.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
   "return merged + left + right", lambda r: (_ints(r),), "mergesort")
_t("edit_distance", "a, b", "returns the Levenshtein distance between the strings `a` and `b`, where insertions, "
   "deletions and substitutions each cost 1", "prev = list(range(len(b) + 1))\nfor i, ca in enumerate(a, 1):\n"
   "    cur = [i]\n    for j, cb in enumerate(b, 1):\n        cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))\n"
   "    prev = cur\nreturn prev[-1]", lambda r: (_word(r)[:r.randint(2, 6)], _word(r)[:r.randint(2, 6)]), "levenshtein")
_t("lcs_length", "a, b", "returns the length of the longest common subsequence of the strings `a` and `b`",
   "table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]\nfor i in range(1, len(a) + 1):\n"
   "    for j in range(1, len(b) + 1):\n        if a[i - 1] == b[j - 1]:\n            table[i][j] = table[i - 1][j - 1] + 1\n"
   "        else:\n            table[i][j] = max(table[i - 1][j], table[i][j - 1])\nreturn table[-1][-1]",
   lambda r: (_word(r), _word(r)), "longest_common_subsequence")
_t("count_change", "amount, coins", "counts the ways to make `amount` from an unlimited supply of coins with the "
   "values in `coins`, where order does not matter", "ways = [1] + [0] * amount\nfor coin in coins:\n"
   "    for total in range(coin, amount + 1):\n        ways[total] += ways[total - coin]\nreturn ways[amount]",
   lambda r: (r.randint(0, 30), sorted(r.sample((1, 2, 3, 5, 10), r.randint(1, 3)))), "change_ways")
_t("min_coins", "amount, coins", "returns the fewest coins from `coins` (unlimited supply) adding up to `amount`, or "
   "-1 if that cannot be done", "best = [0] + [None] * amount\nfor total in range(1, amount + 1):\n"
   "    options = [best[total - c] for c in coins if c <= total and best[total - c] is not None]\n"
   "    best[total] = min(options) + 1 if options else None\nreturn -1 if best[amount] is None else best[amount]",
   lambda r: (r.randint(0, 40), sorted(r.sample((2, 3, 4, 5, 7, 10), r.randint(1, 3)))), "fewest_coins")
_t("climb_stairs", "n", "counts the ways to climb a staircase of `n` steps taking one or two steps at a time",
   "a, b = 1, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a", lambda r: (r.randint(0, 20),), "stair_ways")
_t("subsets", "items", "returns every subset of the list `items` as a list, ordered by size and then by the "
   "positions of their elements", "from itertools import combinations\n"
   "return [list(c) for size in range(len(items) + 1) for c in combinations(items, size)]",
   lambda r: (r.sample(range(1, 10), r.randint(1, 3)),), "power_set")
_t("unique_permutations", "word", "returns the distinct rearrangements of the letters of `word`, sorted "
   "alphabetically", "from itertools import permutations\nreturn sorted(set(''.join(p) for p in permutations(word)))",
   lambda r: (_letters(r, "abca", 2, 3),), "anagrams_of")
_t("hanoi_moves", "n, source='A', target='C', spare='B'", "returns the list of (from_peg, to_peg) moves that solve "
   "the Towers of Hanoi for `n` disks going from `source` to `target`", "if n == 0:\n    return []\n"
   "return (hanoi_moves(n - 1, source, spare, target) + [(source, target)]\n"
   "        + hanoi_moves(n - 1, spare, target, source))", lambda r: (r.randint(1, 3),), "solve_hanoi")
_t("run_length_decode", "encoded", "expands a run-length encoded string such as 'a3b1c2' (each character followed "
   "by its count) back into 'aaabcc'", "import re\n"
   "return ''.join(ch * int(count) for ch, count in re.findall(r'(\\D)(\\d+)', encoded))",
   lambda r: ("".join(r.choice("pqrs") + str(r.randint(1, 12)) for _ in range(r.randint(1, 3))),), "expand_runs")
_t("matrix_multiply", "a, b", "multiplies two matrices given as lists of rows, where the column count of `a` "
   "equals the row count of `b`", "return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]",
   lambda r: (lambda n, m, p: ([_ints(r, -3, 5, m, m) for _ in range(n)], [_ints(r, -3, 5, p, p) for _ in range(m)]))(
       r.randint(1, 2), r.randint(1, 3), r.randint(1, 2)), "matmul")
_t("spiral_order", "matrix", "returns the elements of a rectangular matrix in clockwise spiral order, starting at "
   "the top-left corner", "result = []\nrows = [list(r) for r in matrix]\nwhile rows:\n    result += rows.pop(0)\n"
   "    rows = [list(r) for r in zip(*rows)][::-1]\nreturn result",
   lambda r: ((lambda c: [_ints(r, 0, 9, c, c) for _ in range(r.randint(1, 3))])(r.randint(1, 3)),), "spiral")
_t("pascal_row", "n", "returns row `n` of Pascal's triangle, where row 0 is [1]",
   "row = [1]\nfor _ in range(n):\n    row = [a + b for a, b in zip([0] + row, row + [0])]\nreturn row",
   lambda r: (r.randint(0, 8),), "pascal_triangle_row")
_t("rotate_matrix", "matrix", "rotates a square matrix a quarter turn clockwise and returns the result",
   "return [list(row) for row in zip(*matrix[::-1])]",
   lambda r: ((lambda n: [_ints(r, 0, 9, n, n) for _ in range(n)])(r.randint(2, 3)),), "turn_clockwise")
