package fizzbuzz

import "testing"

func TestSay(t *testing.T) {
	for n, want := range map[int]string{1: "1", 3: "Fizz", 5: "Buzz", 9: "Fizz", 10: "Buzz", 15: "FizzBuzz", 30: "FizzBuzz"} {
		if got := Say(n); got != want {
			t.Errorf("Say(%d) = %q, want %q", n, got, want)
		}
	}
}
