"""Math prompt templates for the synthetic source: money, rates, speed, ages, percentages, fractions,
averages, measurement and geometry (mostly grade-school word problems).

Each template takes a `random.Random` and returns one problem statement, with names, objects and
numbers drawn so that the answer is sensible (a whole number where a word problem expects one).
Written for this project; `math_more.py` has the algebra, counting and number-theory ones.
"""
from __future__ import annotations

import random
from typing import Callable

NAMES = ("Amara Ben Chloe Diego Elena Farid Grace Hiroshi Ines Jamal Keiko Liam Maya Nikhil Olga Pablo Quinn "
         "Rosa Samir Tanya Umar Valeria Wei Ximena Yusuf Zoe Arjun Bianca Carlos Dalia Emeka Freya Gustavo Hana "
         "Ivan Jada Kofi Leila Mateo Nadia Oscar Priya Rafael Sofia Tomas Uma Victor Wanda").split()
SHOP = (("notebooks", 2, 6), ("pencils", 1, 2), ("apples", 1, 2), ("mugs", 4, 12), ("T-shirts", 8, 20),
        ("bags of rice", 3, 9), ("candles", 2, 7), ("comic books", 3, 8), ("plant pots", 5, 15),
        ("loaves of bread", 2, 5), ("jars of honey", 4, 10), ("packs of batteries", 3, 9),
        ("bottles of juice", 1, 4), ("puzzle boxes", 6, 18), ("packs of stickers", 1, 3))
STORES = ("market", "bookshop", "hardware store", "corner shop", "farmers' market", "school fair", "craft store")
PLACES = ("the lake", "her grandmother's house", "the coast", "a campsite", "the city", "a music festival")
CITIES = ("Riverton", "Maple Falls", "Port Alder", "Cedar Hill", "Brookfield", "Stonebridge", "Westmoor")
Template = Callable[[random.Random], str]


def registrar(target: list[tuple[str, Template]]) -> Callable[[str], Callable[[Template], Template]]:
    """A decorator factory: @reg("word") appends ("word", fn) to `target`."""
    def group(name: str) -> Callable[[Template], Template]:
        def register(fn: Template) -> Template:
            target.append((name, fn))
            return fn
        return register
    return group


TEMPLATES: list[tuple[str, Template]] = []  # (group, template): "word" or "comp"
_math = registrar(TEMPLATES)


def _count(n: int, word: str) -> str:
    """'1 hour', '3 hours'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


def _poly(*terms: tuple[int, str]) -> str:
    """An expression from (coefficient, variable) terms: _poly((1, "x^2"), (-3, "x"), (0, "")) is 'x^2 - 3x'."""
    out = ""
    for c, var in terms:
        if c:
            body = ("" if abs(c) == 1 and var else str(abs(c))) + var
            out += (("-" if c < 0 else "") + body) if not out else ((" - " if c < 0 else " + ") + body)
    return out or "0"


# ----------------------------------------------------------------- money and rates
@_math("word")
def change(r):
    name, ((a, alo, ahi), (b, blo, bhi)) = r.choice(NAMES), r.sample(SHOP, 2)
    qa, qb = r.randint(2, 6), r.randint(2, 5)
    pa, pb = r.randint(alo, ahi) + r.choice((0, 0, 0.5)), r.randint(blo, bhi) + r.choice((0, 0.25, 0.5))
    bill = next(v for v in (20, 50, 100, 200, 500) if v > qa * pa + qb * pb)
    return (f"At the {r.choice(STORES)}, {name} buys {qa} {a} at {_usd(pa)} each and {qb} {b} at {_usd(pb)} "
            f"each, paying with a {_usd(bill)} bill. How much change does {name} get back?")


@_math("word")
def budget(r):
    name, k = r.choice(NAMES), r.choice((2, 3, 4, 5))
    m = k * r.randint(6, 40)
    spent = r.randint(1, m - m // k - 1)
    first, second = r.sample(("a video game", "concert tickets", "a birthday present", "new shoes", "art supplies",
                              "a book", "lunch with friends", "a phone case"), 2)
    frac = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}[k]
    return (f"{name} has {_usd(m)} saved up. {name} spends {frac} of it on {first} and then {_usd(spent)} on "
            f"{second}. How much money is left?")


@_math("word")
def wages(r):
    name, rate, wd, sat, weeks = r.choice(NAMES), r.randint(9, 28), r.randint(2, 8), r.randint(2, 6), r.randint(2, 6)
    job = r.choice(("at a bakery", "as a lifeguard", "at the library", "as a tutor", "at a bike shop", "at a cafe"))
    return (f"{name} works {job} for {_usd(rate)} an hour: {wd} hours on each weekday and {sat} hours on "
            f"Saturdays. How much does {name} earn in {weeks} weeks?")


@_math("word")
def unit_price(r):
    item, lo, hi = r.choice(SHOP)
    n, unit = r.randint(3, 12), r.randint(lo, hi)
    m = r.randint(n + 1, 5 * n)
    return (f"A pack of {n} {item} costs {_usd(n * unit)}. At the same price per item, how much would {m} {item} "
            f"cost?")


@_math("word")
def savings_goal(r):
    name, cost = r.choice(NAMES), r.randint(8, 60) * 10
    have, weekly = r.randint(1, cost // 20) * 10, r.randint(3, 25)
    thing = r.choice(("bicycle", "guitar", "tablet", "pair of skates", "telescope", "camera", "drum kit"))
    return (f"{name} wants a {thing} that costs {_usd(cost)}. {name} already has {_usd(have)} and puts away "
            f"{_usd(weekly)} every week. After how many weeks will {name} have enough money?")


@_math("word")
def work_together(r):
    (a, b), k = r.choice(((3, 6), (4, 12), (6, 12), (10, 15), (20, 30), (12, 36), (5, 20), (15, 30))), r.randint(1, 3)
    x, y = r.sample(NAMES, 2)
    job = r.choice(("paint the fence", "weed the garden", "sort the library's returns", "assemble the shelves",
                    "clean the gym", "pack the orders"))
    return (f"{x} can {job} alone in {a * k} hours, and {y} can do the same job alone in {b * k} hours. If they "
            f"work together at these rates, how long will it take them?")


@_math("word")
def tank(r):
    out_rate = r.randint(1, 6)
    in_rate, minutes = out_rate + r.randint(2, 12), r.randint(5, 40)
    return (f"An empty {(in_rate - out_rate) * minutes}-liter tank is filled by a hose that adds {in_rate} liters "
            f"per minute, while a leak lets {out_rate} liters per minute escape. How many minutes until the tank "
            f"is full?")


@_math("word")
def machine(r):
    n, m, h = r.randint(3, 40), r.choice((2, 3, 4, 5, 6, 10, 12, 15, 20, 30)), r.randint(2, 9)
    thing = r.choice(("bottles", "bolts", "cookies", "envelopes", "bricks", "labels"))
    return (f"A machine makes {n} {thing} every {m} minutes. Running without a break, how many {thing} does it "
            f"make in {h} hours?")


@_math("word")
def workers(r):
    w, days = r.randint(2, 12), r.randint(2, 15)
    if days == w:
        days += 1
    w2 = r.choice([d for d in range(2, 31) if w * days % d == 0 and d != w])
    job = r.choice(("build a stone wall", "harvest an orchard", "paint a school", "lay a new path"))
    return (f"{w} workers can {job} in {days} days. Working at the same rate, how many days would "
            f"{w2} workers need?")


@_math("word")
def trip(r):
    name, s1, s2 = r.choice(NAMES), r.randint(4, 14) * 5, r.randint(4, 14) * 5
    h1, h2 = r.randint(1, 4), r.randint(1, 4)
    return (f"On the way to {r.choice(PLACES)}, {name} drives at {s1} miles per hour for {_count(h1, 'hour')} and then at "
            f"{s2} miles per hour for {_count(h2, 'hour')}. How far does {name} travel, and what is the average speed?")


@_math("word")
def trains(r):
    v1, v2, t = r.randint(6, 24) * 5, r.randint(6, 24) * 5, r.randint(1, 5)
    a, b = r.sample(CITIES, 2)
    return (f"Two trains set off at the same moment from {a} and {b}, which are {(v1 + v2) * t} km apart, and "
            f"head toward each other at {v1} km/h and {v2} km/h. After how many hours do they meet, and how far "
            f"from {a}?")


@_math("word")
def catch_up(r):
    while True:  # a bike at 10-24 km/h, a car 20-70 km/h faster, and a whole number of hours to catch up
        v1, t = r.randint(10, 24), r.randint(1, 3)
        gaps = [g for g in range(20, 71) if v1 * t % g == 0]
        if gaps:
            gap = r.choice(gaps)
            break
    x, y = r.sample(NAMES, 2)
    return (f"{x} leaves home on a bike riding at {v1} km/h. {_count(t, 'hour')} later {y} follows the same road by car "
            f"at {v1 + gap} km/h. How long after setting off does {y} catch up with {x}?")


@_math("word")
def round_trip(r):
    (a, b), k = r.choice(((30, 60), (40, 60), (20, 30), (60, 90), (6, 12), (10, 15), (12, 24))), r.randint(1, 2)
    return (f"{r.choice(NAMES)} cycles to {r.choice(PLACES)} at {a * k} km/h and comes back along the same route "
            f"at {b * k} km/h. What is the average speed for the whole round trip?")


# ----------------------------------------------------------------- ages, percentages, fractions, averages
@_math("word")
def ages_sum(r):
    b, d, y = r.randint(4, 40), r.randint(2, 30), r.randint(2, 15)
    x, z = r.sample(NAMES, 2)
    return (f"{x} is {d} years older than {z}, and their ages add up to {2 * b + d}. How old will {z} be in "
            f"{y} years?")


@_math("word")
def ages_past(r):
    b0, k, ago = r.randint(2, 12), r.randint(2, 4), r.randint(2, 10)
    x, z = r.sample(NAMES, 2)
    times = {2: "twice", 3: "three times", 4: "four times"}[k]
    return (f"{x} is {(k - 1) * b0} years older than {z}. {ago} years ago, {x} was {times} as old as {z}. How "
            f"old are {x} and {z} now?")


@_math("word")
def discount_tax(r):
    price, off, tax = r.randint(4, 40) * 5, r.choice((10, 15, 20, 25, 30, 40)), r.choice((5, 6, 8, 10))
    item = r.choice(("jacket", "lamp", "backpack", "pair of boots", "blender", "desk chair"))
    return (f"A {item} has a price tag of {_usd(price)}. It is on sale for {off}% off, and a {tax}% sales tax is "
            f"added to the sale price. What is the final price?")


@_math("word")
def percent_change(r):
    a, pct = r.randint(1, 25) * 20, r.choice((5, 10, 15, 20, 25, 30, 40, 50))
    up = r.random() < 0.6
    b = a * (100 + pct) // 100 if up else a * (100 - pct) // 100
    what = r.choice(("a monthly bus pass", "a gym membership", "a bag of coffee beans", "a concert ticket"))
    return f"The price of {what} changed from {_usd(a)} to {_usd(b)}. By what percent did it {'rise' if up else 'fall'}?"


@_math("word")
def quiz_percent(r):
    n = r.choice((20, 25, 40, 50))
    c, goal = r.randint(n // 2, n - 2), r.choice((80, 85, 90, 95))
    return (f"On a {n}-question quiz, {r.choice(NAMES)} answered {c} questions correctly. What percentage is that, "
            f"and how many more correct answers would have been needed to reach {goal}%?")


@_math("word")
def population(r):
    pop, up, down = r.randint(1, 9) * 10000, r.choice((5, 10, 20, 25)), r.choice((4, 5, 10, 20))
    return (f"The town of {r.choice(CITIES)} had {pop:,} residents. The population grew by {up}% in one year "
            f"and then fell by {down}% the next year. How many residents are there now?")


@_math("word")
def tip_split(r):
    bill, tip, n = r.randint(8, 40) * 5, r.choice((10, 15, 20, 25)), r.randint(2, 6)
    return (f"Dinner for {r.choice(NAMES)} and {_count(n - 1, 'friend')} costs {_usd(bill)} before the tip. They add a "
            f"{tip}% tip and split the total evenly. How much does each person pay?")


@_math("word")
def ratio_share(r):
    a, b, unit = r.randint(1, 7), r.randint(1, 7), r.randint(3, 40)
    x, y = r.sample(NAMES, 2)
    total = (a + b) * unit
    what = r.choice((f"{_usd(total)} of prize money", f"a bag of {total} marbles", f"a box of {total} stickers",
                     f"the {_usd(total)} they earned at a lemonade stand"))
    return f"{x} and {y} split {what} in the ratio {a}:{b}. What share does each of them get?"


@_math("word")
def class_fractions(r):
    a, b = r.choice(((3, 4), (4, 3), (5, 2), (2, 5), (3, 2), (6, 5)))
    n = a * b * r.randint(1, 4) * (2 if a * b < 10 else 1)
    return (f"A school club has {n} members. One {('half', 'third', 'quarter', 'fifth', 'sixth')[a - 2]} of them "
            f"walk to meetings, 1/{b} of the remaining members take the bus, and the rest are driven. How many "
            f"members are driven?")


@_math("word")
def recipe(r):
    s, cups, mult = r.choice((4, 6, 8, 10, 12)), r.choice((1.5, 2, 2.5, 3, 0.75)), r.choice((2, 3, 4, 0.5, 1.5))
    eggs, t = r.randint(1, 3) * (1 if mult == int(mult) else 2), int(s * mult)
    dish = r.choice(("pancakes", "muffins", "banana bread", "cookies", "waffles"))
    return (f"A recipe for {dish} that serves {s} needs {cups:g} cups of flour and {_count(eggs, 'egg')}. How much flour "
            f"and how many eggs are needed for {t} servings?")


@_math("comp")
def fraction_sum(r):
    (a, b), (c, d), (e, f) = [(r.randint(1, q - 1), q) for q in (r.randint(2, 12) for _ in range(3))]
    return (f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}} - \\frac{{{e}}}{{{f}}}$ and write the result "
            f"as a fraction in lowest terms.")


@_math("word")
def needed_score(r):
    scores = [r.randint(68, 96) for _ in range(r.randint(3, 5))]
    target = r.randint(max(sum(scores) // len(scores) - 3, 70), 90)
    need = target * (len(scores) + 1) - sum(scores)
    if not 40 <= need <= 100:
        target = (sum(scores) + 85) // (len(scores) + 1)
    return (f"{r.choice(NAMES)}'s test scores so far are {', '.join(map(str, scores))}. What score on the next "
            f"test would bring the average to exactly {target}?")


@_math("word")
def new_member(r):
    n, a, d = r.randint(4, 12), r.randint(12, 40), r.randint(1, 3)
    group = r.choice(("chess club", "choir", "hiking group", "robotics team", "book club"))
    return (f"The average age of the {n} members of a {group} is {a}. When one new member joins, the average "
            f"age becomes {a + d}. How old is the new member?")


@_math("comp")
def mean_median(r):
    data = [r.randint(1, 30) for _ in range(r.choice((5, 6, 7, 8)))]
    return f"Find the mean, median and range of the data set {', '.join(map(str, data))}."


# ----------------------------------------------------------------- measurement and geometry
@_math("word")
def convert(r):
    big, small, factor, stuff = r.choice((
        ("meters", "centimeters", 100, r.choice(("ribbon", "rope", "wire", "fabric"))),
        ("feet", "inches", 12, r.choice(("ribbon", "rope", "wire", "trim"))), ("yards", "feet", 3, "fabric"),
        ("kilograms", "grams", 1000, r.choice(("clay", "flour", "birdseed"))),
        ("liters", "milliliters", 1000, r.choice(("paint", "resin", "lamp oil"))), ("gallons", "quarts", 4, "paint"),
        ("pounds", "ounces", 16, r.choice(("clay", "wax", "sand")))))
    need = r.randint(3, 40) * factor // r.choice((1, 2, 4)) + r.randint(1, factor - 1)
    return (f"{r.choice(NAMES)} needs {need:,} {small} of {stuff} for a project, but the shop only sells it in "
            f"whole {big}. How many {big} must be bought, and how many {small} will be left over?")


@_math("word")
def pace(r):
    km, mins, km2 = r.randint(3, 12), r.randint(4, 7), r.randint(5, 21)
    return (f"{r.choice(NAMES)} ran {km} km in {km * mins} minutes. What was the pace in minutes per kilometer, "
            f"and how long would a {km2} km run take at that pace?")


@_math("word")
def fence(r):
    l, w, cost, gate = r.randint(5, 40), r.randint(3, 25), r.randint(6, 30), r.randint(1, 3)
    return (f"A rectangular garden measures {l} m by {w} m. Fencing costs {_usd(cost)} per meter, and a {gate} m "
            f"gap is left for a gate. How much does the fencing cost?")


@_math("word")
def paint_wall(r):
    w, h, ww, wh, cover = r.randint(4, 12), r.randint(3, 5), r.randint(1, 2), r.randint(1, 2), r.choice((5, 8, 10))
    return (f"A wall is {w} m wide and {h} m tall and has a {ww} m by {wh} m window. One can of paint covers "
            f"{cover} square meters. How many cans are needed to give the wall two coats?")


@_math("word")
def box_cubes(r):
    s = r.randint(2, 5)
    dims = [s * r.randint(2, 8) for _ in range(3)]
    return (f"How many cubes with {s} cm edges fit inside a box that is {dims[0]} cm by {dims[1]} cm by "
            f"{dims[2]} cm, and what is the box's volume?")


@_math("comp")
def circle(r):
    k = r.randint(2, 30)
    return r.choice((f"A circle has circumference ${2 * k}\\pi$. What is its area, in terms of $\\pi$?",
                     f"A circle has area ${k * k}\\pi$ square units. Find its diameter and circumference.",
                     f"Find the area of a ring between circles of radius {k} and {k + r.randint(1, 6)}."))


@_math("word")
def ladder(r):
    (a, b, c), k = r.choice(((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (6, 8, 10))), r.randint(1, 3)
    return (f"A {c * k}-foot ladder leans against a wall with its foot {a * k} feet from the base of the wall. "
            f"How high up the wall does the ladder reach?")


@_math("comp")
def cylinder(r):
    rad, h = r.randint(1, 9), r.randint(2, 20)
    return r.choice((f"A cylinder has radius {rad} and height {h}. Find its volume and total surface area in "
                     f"terms of $\\pi$.", f"A cone of radius {rad} and height {h} is filled with water, which is "
                     f"then poured into a cylinder of the same radius. How high does the water rise?"))
