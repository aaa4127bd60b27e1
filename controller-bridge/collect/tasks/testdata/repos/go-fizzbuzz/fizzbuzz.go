// Package fizzbuzz says the numbers of the game.
package fizzbuzz

import "strconv"

// Say returns what is said for n: Fizz for a multiple of 3, Buzz for a
// multiple of 5, FizzBuzz for a multiple of both, else the number.
func Say(n int) string {
	switch {
	case n%3 == 0:
		return "Fizz"
	case n%5 == 0:
		return "Buzz"
	case n%15 == 0:
		return "FizzBuzz"
	}
	return strconv.Itoa(n)
}
