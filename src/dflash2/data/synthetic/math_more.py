"""Math prompt templates for the synthetic source: interest, equations, quadratics, sequences,
counting, probability, number theory, exponents, logarithms and functions (word problems and
short competition-style problems). Written for this project; see `math.py`.
"""
from __future__ import annotations

from dflash2.data.synthetic.math import CITIES, NAMES, Template, _poly, _usd, registrar

TEMPLATES: list[tuple[str, Template]] = []
_math = registrar(TEMPLATES)


# ----------------------------------------------------------------- interest and algebra
@_math("word")
def simple_interest(r):
    p, rate, years = r.randint(5, 80) * 100, r.choice((2, 3, 4, 5, 6)), r.randint(2, 8)
    return (f"{r.choice(NAMES)} deposits {_usd(p)} in an account paying {rate}% simple interest per year. How "
            f"much interest is earned after {years} years, and what is the balance then?")


@_math("word")
def compound_interest(r):
    p, rate, years = r.randint(1, 20) * 500, r.choice((2, 3, 4, 5, 8, 10)), r.randint(2, 5)
    how = r.choice(("annually", "every year", "once a year"))
    return (f"An investment of {_usd(p)} earns {rate}% interest compounded {how}. What is it worth after "
            f"{years} years, to the nearest cent?")


@_math("comp")
def linear(r):
    x, a, c = r.randint(-12, 12), r.randint(2, 9), r.randint(-6, 9)
    if a == c:
        a += 1
    b = r.randint(-20, 20)
    d = (a - c) * x + b
    return f"Solve for $x$: ${_poly((a, 'x'), (b, ''))} = {_poly((c, 'x'), (d, ''))}$."


@_math("word")
def think_number(r):
    x, k, m = r.randint(3, 40), r.randint(2, 9), r.randint(1, 30)
    return r.choice((f"{r.choice(NAMES)} thinks of a number, multiplies it by {k} and adds {m}, getting "
                     f"{k * x + m}. What was the number?", f"If {m} less than {k} times a number is "
                     f"{k * x - m}, what is the number?"))


@_math("word")
def consecutive(r):
    k, start, kind = r.randint(3, 5), r.randint(1, 60), r.choice(("", "even ", "odd "))
    step = 1 if not kind else 2
    if kind:
        start = start * 2 + (kind == "odd ")
    return (f"The sum of {k} consecutive {kind}integers is {sum(start + step * i for i in range(k))}. What is the "
            f"largest of them?")


@_math("comp")
def system(r):
    x, y = r.randint(-9, 9), r.randint(-9, 9)
    while True:
        a, b, c, d = (r.randint(-6, 6) or 1 for _ in range(4))
        if a * d - b * c:
            break
    return (f"Solve the system ${_poly((a, 'x'), (b, 'y'))} = {a * x + b * y}$ and "
            f"${_poly((c, 'x'), (d, 'y'))} = {c * x + d * y}$.")


@_math("word")
def tickets(r):
    adult, child = r.randint(8, 20), r.randint(3, 7)
    na, nc = r.randint(20, 150), r.randint(20, 150)
    event = r.choice(("school play", "puppet show", "charity concert", "science fair", "film night"))
    return (f"Tickets for a {event} cost {_usd(adult)} for adults and {_usd(child)} for children. {na + nc} "
            f"tickets were sold for a total of {_usd(adult * na + child * nc)}. How many adult tickets were sold?")


@_math("comp")
def quadratic(r):
    p, q, k = r.randint(-9, 9), r.randint(-9, 9), r.choice((1, 1, 1, 2, 3))
    expr = _poly((k, "x^2"), (-k * (p + q), "x"), (k * p * q, ""))
    return r.choice((f"Find all real solutions of ${expr} = 0$.", f"Factor ${expr}$ completely.",
                     f"What is the sum of the squares of the roots of ${expr} = 0$?"))


@_math("comp")
def vertex(r):
    a, h, k = r.choice((1, -1, 2, -2, 3)), r.randint(-6, 6), r.randint(-10, 10)
    return (f"Find the vertex of the parabola $y = {_poly((a, 'x^2'), (-2 * a * h, 'x'), (a * h * h + k, ''))}$, "
            f"and say whether it is a maximum or a minimum.")


@_math("word")
def rectangle_dims(r):
    l, w = r.randint(4, 30), r.randint(2, 20)
    return (f"A rectangular {r.choice(('rug', 'patio', 'poster', 'field', 'tabletop'))} has a perimeter of "
            f"{2 * (l + w)} and an area of {l * w}. What are its length and width?")


# ----------------------------------------------------------------- sequences, counting, probability
@_math("comp")
def arithmetic_seq(r):
    a, d, i, j, n = r.randint(-20, 20), r.randint(-7, 9) or 3, r.randint(2, 5), r.randint(7, 15), r.randint(16, 40)
    return (f"In an arithmetic sequence, term {i} is {a + (i - 1) * d} and term {j} is {a + (j - 1) * d}. Find "
            f"term {n} and the sum of the first {n} terms.")


@_math("comp")
def geometric_seq(r):
    a, q, n = r.randint(1, 9), r.choice((2, 3, -2, 5)), r.randint(5, 10)
    return r.choice((f"A geometric sequence starts {a}, {a * q}, {a * q * q}, ... What is term {n}?",
                     f"The first term of a geometric sequence is {a} and the ratio is {q}. Find the sum of the "
                     f"first {n} terms."))


@_math("word")
def savings_ramp(r):
    a, d, n = r.randint(1, 10), r.randint(1, 5), r.randint(6, 20)
    return (f"{r.choice(NAMES)} saves {_usd(a)} in the first week and each week after that saves {_usd(d)} more "
            f"than the week before. How much has been saved in total after {n} weeks?")


@_math("word")
def outfits(r):
    s, p, h = r.randint(2, 9), r.randint(2, 6), r.randint(2, 5)
    return (f"{r.choice(NAMES)} packs {s} shirts, {p} pairs of trousers and {h} hats. An outfit is one shirt, one "
            f"pair of trousers and either one hat or no hat. How many different outfits are possible?")


@_math("comp")
def committee(r):
    n, k = r.randint(6, 15), r.randint(2, 5)
    return r.choice((f"In how many ways can a committee of {k} be chosen from {n} people? How many of those "
                     f"committees include one particular person?",
                     f"From a group of {n} students, a president, a treasurer and a secretary are chosen, and one "
                     f"student cannot hold two roles. In how many ways can this be done?"))


@_math("comp")
def arrangements(r):
    word = r.choice(("BANANA", "LETTER", "COFFEE", "PEPPER", "BALLOON", "TOMATO", "SUCCESS", "CHEESE",
                     "BOOKKEEPER", "ASSESS", "PARALLEL", "ADDRESS", "COMMITTEE", "CANNON", "RACECAR", "LLAMA"))
    return r.choice((f"How many distinct arrangements of the letters of {word} are there?",
                     f"How many different strings can be made by rearranging all the letters of {word}, and in "
                     f"how many of them is the first letter {word[-1]}?"))


@_math("word")
def handshakes(r):
    n = r.randint(5, 30)
    return r.choice((f"At a {r.choice(('workshop', 'reunion', 'conference', 'party'))}, each of the {n} guests "
                     f"shakes hands with every other guest exactly once. How many handshakes are there?",
                     f"In a league of {n} teams, every team plays every other team twice. How many games are "
                     f"played in the season?"))


@_math("comp")
def marbles(r):
    red, blue, green = r.randint(2, 9), r.randint(2, 9), r.randint(1, 6)
    color = r.choice(("red", "blue"))
    return (f"A bag has {red} red, {blue} blue and {green} green marbles. Two marbles are drawn without "
            f"replacement. What is the probability that both are {color}? Give a fraction in lowest terms.")


@_math("comp")
def dice(r):
    sides, s = r.choice((4, 6, 6, 8, 10, 12)), r.randint(3, 9)
    return r.choice((f"Two fair {sides}-sided dice, numbered 1 to {sides}, are rolled. What is the probability "
                     f"that the sum is {s}?", f"Two fair {sides}-sided dice are rolled. What is the probability "
                     f"that the product of the numbers shown is even?", f"Three fair six-sided dice are rolled. "
                     f"What is the probability that the sum is {s + 3}?"))


@_math("comp")
def coins(r):
    n = r.randint(3, 10)
    k = r.randint(1, n - 1)
    return (f"A fair coin is tossed {n} times. What is the probability of getting exactly {k} head{'s' if k > 1 else ''}? And of "
            f"getting at least one tail?")


# ----------------------------------------------------------------- number theory, exponents, functions
@_math("word")
def buses(r):
    a, b, h = r.choice((6, 8, 10, 12, 15, 18, 20)), r.choice((9, 14, 16, 24, 25, 30, 45)), r.randint(6, 9)
    return (f"One bus leaves the {r.choice(CITIES)} depot every {a} minutes and another every {b} minutes. Both "
            f"leave together at {h}:00 a.m. When will they next leave together?")


@_math("word")
def gift_bags(r):
    g, (p, q) = r.randint(2, 12), r.choice(((2, 3), (3, 4), (3, 5), (4, 5), (5, 7), (2, 7), (5, 8)))
    return (f"{r.choice(NAMES)} has {g * p} pencils and {g * q} erasers and wants to make identical gift bags "
            f"using all of them. What is the greatest number of bags, and what goes in each?")


@_math("comp")
def divisors(r):
    n = r.choice((2, 3, 4, 8)) * r.choice((3, 5, 9, 7, 25)) * r.choice((1, 7, 11, 13))
    return r.choice((f"How many positive divisors does {n} have?", f"What is the sum of all positive divisors of "
                     f"{n}?", f"What is the largest prime factor of {n * r.choice((1, 17, 19))}?"))


@_math("comp")
def divisible_count(r):
    n, a, b = r.randint(50, 1000), r.randint(2, 9), r.randint(3, 13)
    return r.choice((f"How many integers from 1 to {n} are divisible by {a} or {b}?",
                     f"How many integers from 1 to {n} are divisible by {a} but not by {b}?"))


@_math("comp")
def exponent_eq(r):
    base, a, c, x = r.choice((2, 3, 5)), r.randint(1, 3), r.randint(-2, 4), r.randint(1, 4)
    if a * x + c < 1:
        c = 1 - a * x + r.randint(0, 2)
    return f"Solve for $x$: ${base}^{{{_poly((a, 'x'), (c, ''))}}} = {base ** (a * x + c)}$."


@_math("comp")
def logs(r):
    b, m, n = r.choice((2, 3, 5, 10)), r.randint(1, 4), r.randint(1, 4)
    return r.choice((f"Evaluate $\\log_{{{b}}} {b ** m} + \\log_{{{b}}} {b ** n}$.",
                     f"Solve for $x$: $\\log_{{{b}}} ({_poly((1, 'x'), (-m, ''))}) = {n}$.",
                     f"Simplify $\\log_{{{b}}} {b ** (m + n)} - \\log_{{{b}}} {b ** m}$."))


@_math("comp")
def mod_power(r):
    a, n, m = r.randint(2, 19), r.randint(10, 200), r.choice((5, 7, 9, 10, 11, 13, 100))
    return f"What is the remainder when ${a}^{{{n}}}$ is divided by {m}?"


@_math("word")
def weekday(r):
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    return (f"Today is {r.choice(days)}. {r.choice(NAMES)}'s trip starts in {r.randint(20, 900)} days. On what "
            f"day of the week does the trip start?")


@_math("comp")
def crt(r):
    m1, m2 = r.choice(((3, 5), (4, 7), (5, 6), (7, 9), (8, 5), (9, 10), (11, 4)))
    return (f"Find the smallest positive integer that leaves remainder {r.randint(1, m1 - 1)} when divided by {m1} "
            f"and remainder {r.randint(1, m2 - 1)} when divided by {m2}.")


@_math("comp")
def composition(r):
    a, b, c, k = r.randint(2, 6), r.randint(-9, 9), r.randint(-5, 5), r.randint(-4, 4)
    return (f"Let $f(x) = {_poly((a, 'x'), (b, ''))}$ and $g(x) = {_poly((1, 'x^2'), (c, ''))}$. Find $f(g({k}))$ "
            f"and $g(f({k}))$.")


@_math("comp")
def line(r):
    x1, y1, m, dx = r.randint(-6, 6), r.randint(-9, 9), r.choice((-3, -2, -1, 1, 2, 3, 4)), r.randint(1, 5)
    return (f"Find the equation of the line through $({x1}, {y1})$ and $({x1 + dx}, {y1 + m * dx})$, and the "
            f"point where it crosses the x-axis.")


@_math("comp")
def inverse(r):
    a, b, c, k = r.randint(2, 7), r.randint(-9, 9), r.randint(2, 5), r.randint(-5, 9)
    return f"If $f(x) = \\frac{{{_poly((a, 'x'), (b, ''))}}}{{{c}}}$, find $f^{{-1}}({k})$."


@_math("comp")
def distance(r):
    (a, b, c), x, y = r.choice(((3, 4, 5), (5, 12, 13), (6, 8, 10), (8, 15, 17))), r.randint(-8, 8), r.randint(-8, 8)
    return f"Find the distance between the points $({x}, {y})$ and $({x + a}, {y - b})$, and their midpoint."


@_math("comp")
def domain(r):
    a, b = r.randint(-9, 9), r.randint(-9, 9)
    top, bottom = _poly((1, "x"), (-a, "")), _poly((1, "x"), (-b, ""))
    return f"What is the domain of $f(x) = \\frac{{\\sqrt{{{top}}}}}{{{bottom}}}$? Use interval notation."


@_math("word")
def mixture(r):
    v, q, k = r.randint(2, 20) * 5, r.choice((5, 10, 20)), r.randint(2, 4)
    return (f"A {v}-liter tank holds a solution that is {q * k}% salt. How many liters of pure water must be "
            f"added to bring it down to {q}% salt?")


@_math("word")
def profit(r):
    n, cost, broken = r.randint(20, 200), r.randint(2, 20), r.randint(2, 12)
    price = cost + r.randint(1, 10)
    item = r.choice(("vases", "phone cases", "plants", "scarves", "lamps"))
    return (f"A shop buys {n} {item} for {_usd(cost)} each and sells them for {_usd(price)} each, but {broken} of "
            f"them break and cannot be sold. What is the shop's profit?")
