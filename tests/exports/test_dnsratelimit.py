"""The DNS server's response-rate limiter: a bucket per client network, every second
answer past the rate truncated, a bounded number of networks kept."""

from urlguard.exports.dnsratelimit import RateLimiter, network_key


def test_rate_limiter_truncates_every_second_answer_beyond_the_rate():
    now = [0.0]
    limiter = RateLimiter(3, clock=lambda: now[0])
    seen = [limiter.allow("192.0.2.1") for _ in range(7)]
    assert seen == ["answer"] * 3 + ["slip", "drop", "slip", "drop"]
    assert limiter.allow("192.0.2.200") != "answer"  # the same /24 shares the bucket
    assert limiter.allow("198.51.100.1") == "answer"
    now[0] = 1.0
    assert limiter.allow("192.0.2.1") == "answer"


def test_the_rate_limiter_keeps_a_bounded_number_of_networks_the_least_recent_going_first():
    now = [0.0]
    limiter = RateLimiter(2, clock=lambda: now[0], capacity=3)
    assert [limiter.allow("192.0.2.1") for _ in range(3)] == ["answer", "answer", "slip"]
    for n in range(100_000):  # a flood claiming a new network a packet
        assert limiter.allow(f"{10 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}.1") == "answer"
        if n % 2:
            assert limiter.allow("192.0.2.9") != "answer"  # the busy one stays limited
    assert len(limiter._buckets) == 3
    assert limiter.allow("::ffff:192.0.2.77") != "answer"  # mapped: the same /24
    assert limiter.allow("2001:db8:0:ff::1") == "answer"
    assert limiter.allow("2001:db8:0:ff:ffff::2") == "answer"
    assert limiter.allow("2001:db8:0:ff:1::3") != "answer"  # the same /56


def test_a_network_is_an_ipv4_slash_24_or_an_ipv6_slash_56():
    assert network_key("192.0.2.1") == network_key("192.0.2.254") != network_key("192.0.3.1")
    assert network_key("::ffff:192.0.2.9") == network_key("192.0.2.1")
    assert network_key("2001:db8:0:ff::1") == network_key("2001:db8:0:ff:ffff::2")
    assert network_key("2001:db8:0:100::1") != network_key("2001:db8:0:ff::1")
    assert network_key("fe80::1%eth0") == network_key("fe80::2")
    # No IPv6 /56 is taken for an IPv4 /24.
    assert network_key("::c000:201") != network_key("192.0.2.1")
